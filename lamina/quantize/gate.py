"""The accuracy gate of `lamina quantize`: budgets, the checks against them, and the table it prints.

A quantized model passes when its perplexity increase and mean KL against the unquantized model are
within budget, and its code-completion exact match (lamina/quantize/code_completion.py) is at most
--max-em-drop points below the unquantized model's; a calibrated method (gptq, awq) must also have a lower
perplexity than its reference method (rtn4), measured in the same run on the same text.
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module at start-up: keep the models out of it
    from lamina.quantize.code_completion import CodeResult
    from lamina.quantize.evaluate import EvalResult

# exact-match points a method may lose on the code-completion lines: 8-bit weights should lose next to none,
# 4-bit ones some (one line of the default 128 is 0.78 points)
MAX_EM_DROP = {8: 2.0, 4: 5.0}


def budgets(args: argparse.Namespace, recipe: Any) -> dict[str, float]:
    """{"ppl": relative increase, "kl": nats, "em": exact-match points} from --max-ppl-increase / --max-kl /
    --max-em-drop or the recipe's defaults."""
    ppl = recipe.max_ppl_increase if args.max_ppl_increase is None else args.max_ppl_increase / 100
    kl = recipe.max_kl if args.max_kl is None else args.max_kl
    em = getattr(args, "max_em_drop", None)
    em = MAX_EM_DROP.get(recipe.weight_args(128).num_bits, MAX_EM_DROP[4]) if em is None else em
    for name, value in (("--max-ppl-increase", ppl), ("--max-kl", kl), ("--max-em-drop", em)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return {"ppl": ppl, "kl": kl, "em": em}


def code_eval(args: argparse.Namespace, model_dir: str, baseline_dir: str | None) -> CodeResult | None:
    """The code-completion metric for --code-cases / --code-functions (None with --code-cases 0)."""
    if args.code_cases == 0:
        return None
    if args.code_cases < 0:
        raise ValueError(f"--code-cases must be >= 0 (0: off), got {args.code_cases}")
    from lamina.quantize.code_completion import DEFAULT_FUNCTIONS, evaluate_code, read_functions

    texts = read_functions(args.code_functions or DEFAULT_FUNCTIONS)
    return evaluate_code(model_dir, baseline_dir, texts, args.code_cases, args.device)


def over_budget(result: EvalResult, max_ppl: float, max_kl: float, code: CodeResult | None = None,
                max_em_drop: float | None = None) -> list[str]:
    """One message per metric over its budget (empty: within budget)."""
    failures = []
    if code is not None and max_em_drop is not None and code.em_drop is not None and code.em_drop > max_em_drop:
        failures.append(f"code exact match {100 * code.exact_match:.2f} % is {code.em_drop:.2f} points below the "
                        f"unquantized model's {100 * code.baseline_exact_match:.2f} %, over the budget of "
                        f"{max_em_drop:g} points (--max-em-drop)")
    if result.ppl_increase > max_ppl:
        failures.append(f"perplexity {100 * result.ppl_increase:+.2f} % is over the budget of "
                        f"+{100 * max_ppl:.2f} % (--max-ppl-increase)")
    if result.kl > max_kl:
        failures.append(f"KL {result.kl:.5f} nats/token is over the budget of {max_kl:g} (--max-kl)")
    return failures


def not_better(result: EvalResult, reference: EvalResult, name: str, reference_name: str) -> list[str]:
    """A message when `name`'s perplexity is not below its reference method's (empty: it is)."""
    if result.perplexity < reference.perplexity:
        return []
    return [f"perplexity {result.perplexity:.4f} is not better than {reference_name}'s {reference.perplexity:.4f} "
            f"({name} must beat {reference_name})"]


def _ppl_budget(budgets: dict[str, float], reference_name: str | None) -> str:
    cell = f"+{100 * budgets['ppl']:.2f} %" if "ppl" in budgets else "-"
    return f"{cell} and < {reference_name}" if reference_name else cell


def table(result: EvalResult, name: str, budgets: dict[str, float] | None = None,
          reference: EvalResult | None = None, reference_name: str | None = None, code: CodeResult | None = None,
          reference_code: CodeResult | None = None, must_beat: bool = True) -> str:
    """The results as a small text table (budgets: {"ppl": relative, "kl": nats, "em": points}); with
    `reference`, a column for the reference method and the perplexity budget that says the result must beat it;
    with `code`, the code-completion rows."""
    budgets = budgets or {}
    ref = reference is not None
    head = ("metric", "baseline", *((reference_name or "reference",) if ref else ()), name, "change", "budget")
    rows = [head]
    if result.baseline_perplexity is None:
        rows.append(("perplexity", "-", *(("-",) if ref else ()), f"{result.perplexity:.4f}", "-", "-"))
    else:
        cells = {"ppl": lambda r: f"{r.perplexity:.4f}", "kl": lambda r: f"{r.kl:.5f}",
                 "top1": lambda r: f"{100 * r.top1_agreement:.2f} %"}
        refs = {key: ((cell(reference),) if ref else ()) for key, cell in cells.items()}
        rows.append(("perplexity", f"{result.baseline_perplexity:.4f}", *refs["ppl"], cells["ppl"](result),
                     f"{100 * result.ppl_increase:+.2f} %",
                     _ppl_budget(budgets, reference_name if ref and must_beat else None)))
        rows.append(("KL (nats/token)", "0", *refs["kl"], cells["kl"](result), "-",
                     f"{budgets['kl']:g}" if "kl" in budgets else "-"))
        rows.append(("top-1 agreement", "100 %", *refs["top1"], cells["top1"](result), "-", "-"))
    if code is not None:
        rows += _code_rows(code, budgets or {}, reference_code if ref else None, ref)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    counts = f"{result.tokens} tokens scored" + (f", {code.cases} code lines completed" if code else "")
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]]) + f"\n({counts})"


def _code_rows(code: CodeResult, budgets: dict[str, float], reference: CodeResult | None,
               ref: bool) -> list[tuple[str, ...]]:
    """Code exact match (vs the reference lines) and agreement (vs the unquantized model's own lines)."""
    pct = lambda value: "-" if value is None else f"{100 * value:.2f} %"  # noqa: E731
    refs = {key: ((pct(getattr(reference, key)) if reference else "-",) if ref else ())
            for key in ("exact_match", "agreement")}
    change = "-" if code.em_drop is None else f"{-code.em_drop:+.2f} pt"
    budget = f"-{budgets['em']:g} pt" if "em" in budgets else "-"
    base = pct(code.baseline_exact_match)
    return [("code exact match", base, *refs["exact_match"], pct(code.exact_match), change, budget),
            ("code agreement", "-" if code.agreement is None else "100 %", *refs["agreement"], pct(code.agreement),
             "-", "-")]

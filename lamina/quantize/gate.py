"""The accuracy gate of `lamina quantize`: budgets, the checks against them, and the table it prints.

A quantized model passes when its perplexity increase and mean KL against the unquantized model are
within budget; a calibrated method (gptq, awq) must also have a lower perplexity than its reference
method (rtn4), measured in the same run on the same text.
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module at start-up: keep the models out of it
    from lamina.quantize.evaluate import EvalResult


def budgets(args: argparse.Namespace, recipe: Any) -> dict[str, float]:
    """{"ppl": relative increase, "kl": nats} from --max-ppl-increase / --max-kl or the recipe's defaults."""
    ppl = recipe.max_ppl_increase if args.max_ppl_increase is None else args.max_ppl_increase / 100
    kl = recipe.max_kl if args.max_kl is None else args.max_kl
    for name, value in (("--max-ppl-increase", ppl), ("--max-kl", kl)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return {"ppl": ppl, "kl": kl}


def over_budget(result: EvalResult, max_ppl: float, max_kl: float) -> list[str]:
    """One message per metric over its budget (empty: within budget)."""
    failures = []
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
          reference: EvalResult | None = None, reference_name: str | None = None, must_beat: bool = True) -> str:
    """The results as a small text table (budgets: {"ppl": relative, "kl": nats}); with `reference`, a column
    for the reference method and the perplexity budget that says the result must beat it."""
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
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]]) + f"\n({result.tokens} tokens scored)"

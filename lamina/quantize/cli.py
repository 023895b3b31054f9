"""`lamina quantize` (quantize, evaluate, gate, write) and `lamina eval` (the same evaluation alone)."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lamina import DEMO_MODEL, __version__
from lamina.quant.recipe import get_recipe, method_names

SUMMARY = "quantize_summary.json"
GATE_FAILED = 1  # exit status when over budget (errors exit 2, as in every lamina command)

QUANTIZE_DESCRIPTION = """\
Quantize a Hugging Face checkpoint (Llama, Mistral, Qwen2, Qwen3) and write it in the compressed-tensors
format that lamina, vLLM and transformers load (see docs/quantization.md).

  int8  W8A16: int8 weights, one symmetric scale per output channel (round to nearest)
  rtn4  W4A16: int4 weights, a scale and zero point per group of --group-size input columns (round to nearest)

Accuracy gate: the quantized checkpoint is evaluated against MODEL with lamina's own forward (torch, float32):
perplexity on held-out text and the mean KL divergence of the next-token distributions. Over budget, nothing
is written and the exit status is 1, unless --force. Default budgets: int8 +1 % perplexity and KL 0.01;
rtn4 +5 % and KL 0.1. Default held-out text: Python source shipped with lamina (lamina/quantize/data/).
DIR receives the checkpoint and quantize_summary.json (options, metrics, budgets).
"""


def _add_eval_args(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--eval-text", default=None, metavar="FILE",
      help="held-out text: a .jsonl file of {'text': ...} lines or any text file (default: lamina's sample)")
    a("--window", type=int, default=512, help="tokens per scored window (default 512)")
    a("--max-eval-tokens", type=int, default=None, metavar="N", help="score at most N tokens (default: all)")
    a("--device", default="cpu", help="where the evaluation runs: cpu (default), cuda, cuda:N")


def register(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser("quantize", help="quantize a checkpoint (int8, rtn4), check its accuracy, write it",
                       description=QUANTIZE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("model", help="the unquantized model directory")
    q.add_argument("--method", required=True, choices=method_names(), help="int8 or rtn4 (see above)")
    q.add_argument("--group-size", type=int, default=None,
                   help="input columns per scale group, rtn4 only (default 128)")
    q.add_argument("--output", required=True, metavar="DIR", help="where to write the quantized checkpoint")
    q.add_argument("--force", action="store_true", help="write the checkpoint even when over budget")
    q.add_argument("--max-ppl-increase", type=float, default=None, metavar="PCT",
                   help="perplexity budget, percent over the unquantized model (default: int8 1, rtn4 5)")
    q.add_argument("--max-kl", type=float, default=None, metavar="NATS",
                   help="mean KL budget per token (default: int8 0.01, rtn4 0.1)")
    q.add_argument("--ignore", nargs="*", default=["lm_head"], metavar="TARGET",
                   help="layers left unquantized: names or 're:<regex>' (default: lm_head)")
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_eval_args(q)
    q.set_defaults(func=run_quantize)
    e = sub.add_parser("eval", help="perplexity of a model on held-out text; with --baseline, KL against it",
                       description="Evaluate MODEL as `lamina quantize` does: perplexity on held-out text and, "
                                   "with --baseline, the mean KL divergence and top-1 agreement against it.")
    e.add_argument("model", nargs="?", default=DEMO_MODEL, help="a model directory (default: the demo model)")
    e.add_argument("--baseline", default=None, metavar="MODEL", help="the model to compare against")
    e.add_argument("--json", default=None, metavar="FILE", help="also write the results as JSON")
    _add_eval_args(e)
    e.set_defaults(func=run_eval)


def _windows(args: argparse.Namespace, model_dir: str) -> list[list[int]]:
    from lamina.loader.tokenizer import Tokenizer
    from lamina.quantize.evaluate import DEFAULT_EVAL_TEXT, read_eval_texts, token_windows

    texts = read_eval_texts(args.eval_text or DEFAULT_EVAL_TEXT)
    return token_windows(texts, Tokenizer.from_pretrained(model_dir), args.window, args.max_eval_tokens)


def _table(result: Any, name: str, budgets: dict[str, float] | None = None) -> str:
    """The results as a small text table (budgets: {"ppl": relative, "kl": nats})."""
    budgets = budgets or {}
    rows = [("metric", "baseline", name, "change", "budget")]
    if result.baseline_perplexity is None:
        rows.append(("perplexity", "-", f"{result.perplexity:.4f}", "-", "-"))
    else:
        ppl_budget = f"+{100 * budgets['ppl']:.2f} %" if "ppl" in budgets else "-"
        rows.append(("perplexity", f"{result.baseline_perplexity:.4f}", f"{result.perplexity:.4f}",
                     f"{100 * result.ppl_increase:+.2f} %", ppl_budget))
        rows.append(("KL (nats/token)", "0", f"{result.kl:.5f}", "-", f"{budgets['kl']:g}" if "kl" in budgets else "-"))
        rows.append(("top-1 agreement", "100 %", f"{100 * result.top1_agreement:.2f} %", "-", "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]]) + f"\n({result.tokens} tokens scored)"


def over_budget(result: Any, max_ppl: float, max_kl: float) -> list[str]:
    """One message per metric over its budget (empty: within budget)."""
    failures = []
    if result.ppl_increase > max_ppl:
        failures.append(f"perplexity {100 * result.ppl_increase:+.2f} % is over the budget of "
                        f"+{100 * max_ppl:.2f} % (--max-ppl-increase)")
    if result.kl > max_kl:
        failures.append(f"KL {result.kl:.5f} nats/token is over the budget of {max_kl:g} (--max-kl)")
    return failures


def _check_output(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"--output {str(path)!r} exists and is not an empty directory; choose another or remove it")


def _budgets(args: argparse.Namespace, recipe: Any) -> dict[str, float]:
    ppl = recipe.max_ppl_increase if args.max_ppl_increase is None else args.max_ppl_increase / 100
    kl = recipe.max_kl if args.max_kl is None else args.max_kl
    for name, value in (("--max-ppl-increase", ppl), ("--max-kl", kl)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return {"ppl": ppl, "kl": kl}


def _group_size(args: argparse.Namespace, recipe: Any) -> int:
    if not recipe.uses_group_size:
        if args.group_size is not None:
            raise ValueError(f"--group-size: {recipe.name} has one scale per output channel; it takes no group size")
        return 0
    size = 128 if args.group_size is None else args.group_size
    if size <= 0:
        raise ValueError(f"--group-size must be a positive integer, got {size}")
    return size


def run_quantize(args: argparse.Namespace) -> int:
    from lamina.quantize.evaluate import evaluate
    from lamina.quantize.writer import quantize_checkpoint

    recipe = get_recipe(args.method)
    budgets, group_size, output = _budgets(args, recipe), _group_size(args, recipe), Path(args.output)
    _check_output(output)
    windows = _windows(args, args.model)
    staging = output.with_name(f".{output.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        done = quantize_checkpoint(args.model, str(staging), recipe, group_size, tuple(args.ignore),
                                   progress=not args.no_progress)
        print(f"quantized {len(done.quantized)} layers with {recipe.name}: {done.bytes_before / 1e6:.1f} MB -> "
              f"{done.bytes_after / 1e6:.1f} MB of weights in {done.seconds:.1f} s", file=sys.stderr)
        start = time.perf_counter()
        result = evaluate(str(staging), windows, args.model, args.device)
        print(_table(result, recipe.name, budgets))
        failures = over_budget(result, budgets["ppl"], budgets["kl"])
        _write_summary(staging, args, recipe, done, result, budgets, failures, time.perf_counter() - start)
        if failures and not args.force:
            print(f"lamina quantize: {'; '.join(failures)}: nothing written (--force writes it anyway)",
                  file=sys.stderr)
            return GATE_FAILED
        if output.exists():
            output.rmdir()  # empty (checked above): the staged directory takes its place
        staging.rename(output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    note = f" despite: {'; '.join(failures)}" if failures else ""
    print(f"wrote {output}{note}", file=sys.stderr)
    return 0


def _write_summary(directory: Path, args: argparse.Namespace, recipe: Any, done: Any, result: Any,
                   budgets: dict[str, float], failures: list[str], eval_seconds: float) -> None:
    summary = {
        "lamina_version": __version__, "model": str(args.model), "method": recipe.name,
        "weights": asdict(done.args), "ignore": list(args.ignore), "quantized_layers": len(done.quantized),
        "weight_bytes": {"before": done.bytes_before, "after": done.bytes_after},
        "quantize_seconds": round(done.seconds, 2),
        "evaluation": {"text": args.eval_text or "lamina/quantize/data/heldout_python.jsonl", "window": args.window,
                       "engine": f"lamina model forward, torch reference path, float32, {args.device}",
                       "seconds": round(eval_seconds, 2), **asdict(result), "ppl_increase": result.ppl_increase},
        "budgets": {"max_ppl_increase": budgets["ppl"], "max_kl": budgets["kl"]},
        "passed": not failures, "failures": failures, "forced": bool(args.force and failures),
    }
    (directory / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")


def run_eval(args: argparse.Namespace) -> int:
    from lamina.quantize.evaluate import evaluate

    result = evaluate(args.model, _windows(args, args.model), args.baseline, args.device)
    print(_table(result, Path(args.model).name or "model"))
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "baseline": args.baseline, **asdict(result),
                                               "ppl_increase": result.ppl_increase}, indent=2) + "\n")
    return 0

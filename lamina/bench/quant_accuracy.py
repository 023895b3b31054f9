"""Accuracy of every quantization method on one model, as users run them (issue #13).

    python -m lamina.bench.quant_accuracy [--model DIR] [--methods int8,llm_int8,...] [--num-samples N]
                                          [--code-cases N] [--max-eval-tokens N] [--work-dir DIR]
                                          [--result-file out.json]

Each row is one `lamina quantize MODEL --method M --output WORK/LABEL --force` (a subprocess, as typed; --force
so that a method over its budget still gives its row, marked), read back from the quantize_summary.json it
writes: perplexity on the held-out text and its increase, the mean KL and top-1 agreement against the
unquantized model, the code-completion exact match and its drop, the code agreement (lines identical to the
unquantized model's own), and the seconds to quantize. The W8A8 rows are then scored against `int8` (the same
int8 weights, 16-bit activations) with `lamina eval --baseline`: the KL that quantizing the activations adds on
its own. A table is printed last.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lamina.bench.cpu_report import cpu_bench_parser, run_info, write_report

LABELS = {  # label -> the `lamina quantize` flags of that row
    "int8": ["--method", "int8"], "llm_int8": ["--method", "llm_int8"], "w8a8": ["--method", "w8a8"],
    "smoothquant": ["--method", "smoothquant"], "fp8": ["--method", "fp8"], "rtn4": ["--method", "rtn4"],
    "gptq": ["--method", "gptq"], "gptq-act-order": ["--method", "gptq", "--act-order"], "awq": ["--method", "awq"],
}
CALIBRATED = ("smoothquant", "gptq", "gptq-act-order", "awq")
W8A8 = ("llm_int8", "w8a8", "smoothquant", "fp8")


def _lamina(*args: str) -> None:
    print("$ lamina " + " ".join(args), file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "lamina.cli", *args], check=True)


def quantize_row(model: str, label: str, work: Path, num_samples: int | None, eval_args: list[str]) -> dict:
    """Quantize with one row's flags; the row's numbers from its summary."""
    out = work / label
    extra = ["--num-samples", str(num_samples)] if num_samples and label in CALIBRATED else []
    _lamina("quantize", model, *LABELS[label], *extra, *eval_args, "--output", str(out), "--force", "--no-progress")
    summary = json.loads((out / "quantize_summary.json").read_text())
    ev, code = summary["evaluation"], summary.get("code_completion") or {}
    return {"label": label, "ppl": ev["perplexity"], "ppl_baseline": ev["baseline_perplexity"],
            "ppl_increase": ev["ppl_increase"], "kl": ev["kl"], "top1": ev["top1_agreement"],
            "code_em": code.get("exact_match"), "code_em_baseline": code.get("baseline_exact_match"),
            "code_em_drop": code.get("em_drop"), "code_agreement": code.get("agreement"),
            "code_cases": code.get("cases"), "quantize_seconds": summary["quantize_seconds"],
            "weight_bytes": summary["weight_bytes"]["after"],
            "calibration": summary.get("calibration", {}).get("sequences"),
            "passed": summary["passed"], "failures": summary["failures"]}


def kl_against(model_dir: Path, baseline_dir: Path, eval_args: list[str]) -> float:
    """The mean KL of one checkpoint against another (`lamina eval --baseline`, no code lines)."""
    result = model_dir / f"eval-vs-{baseline_dir.name}.json"
    eval_args = [a for a in eval_args if not a.startswith("--code-cases=")]
    _lamina("eval", str(model_dir), "--baseline", str(baseline_dir), *eval_args, "--code-cases", "0",
            "--json", str(result))
    return json.loads(result.read_text())["kl"]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def table(base: dict, rows: list[dict]) -> str:
    lines = ["| | perplexity | vs bf16 | KL | top-1 | code exact match | vs bf16 | code agreement | KL vs int8 "
             "| quantize s | gate |", "|---|---|---|---|---|---|---|---|---|---|---|",
             f"| unquantized | {base['ppl']:.4f} | | 0 | 100 % | {_pct(base['code_em'])} | | 100 % | | | |"]
    for r in rows:
        drop = "-" if r["code_em_drop"] is None else f"{-r['code_em_drop']:+.2f} pt"
        kl8 = "-" if r.get("kl_vs_int8") is None else f"{r['kl_vs_int8']:.5f}"
        lines.append(f"| `{r['label']}` | {r['ppl']:.4f} | {100 * r['ppl_increase']:+.2f} % | {r['kl']:.5f} | "
                     f"{_pct(r['top1'])} | {_pct(r['code_em'])} | {drop} | {_pct(r['code_agreement'])} | {kl8} | "
                     f"{r['quantize_seconds']:.1f} | "
                     f"{'pass' if r['passed'] else 'OVER'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = cpu_bench_parser(__doc__)
    parser.add_argument("--methods", default=",".join(LABELS), help=f"rows, comma-separated, of {list(LABELS)}")
    parser.add_argument("--num-samples", type=int, default=None,
                        help="calibration sequences of the calibrated rows (default: lamina quantize's)")
    parser.add_argument("--work-dir", default="out/quant-accuracy", help="where the checkpoints are written")
    parser.add_argument("--code-cases", type=int, default=None, help="the gate's code lines (default: its 128)")
    parser.add_argument("--max-eval-tokens", type=int, default=None, help="held-out tokens scored (default: all)")
    args = parser.parse_args(argv)
    labels = args.methods.split(",")
    if unknown := [x for x in labels if x not in LABELS]:
        parser.error(f"--methods: {unknown} unknown; allowed: {list(LABELS)}")
    work = Path(args.work_dir)
    if work.exists() and any(work.iterdir()):
        parser.error(f"--work-dir {str(work)!r} is not empty; choose another or remove it")
    eval_args = [f"--{name.replace('_', '-')}={value}" for name, value in
                 (("code_cases", args.code_cases), ("max_eval_tokens", args.max_eval_tokens)) if value is not None]
    rows = [quantize_row(args.model, label, work, args.num_samples, eval_args) for label in labels]
    if "int8" in labels:
        for row in rows:
            if row["label"] in W8A8:
                row["kl_vs_int8"] = kl_against(work / row["label"], work / "int8", eval_args)
    base = {"ppl": rows[0]["ppl_baseline"], "code_em": rows[0]["code_em_baseline"]}
    write_report(args.result_file, {**run_info(), "model": args.model, "num_samples": args.num_samples,
                                    "eval_args": eval_args, "unquantized": base, "rows": rows})
    print(table(base, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Gather the demo-model runs into one results file (benchmarks/results/demo_models.json).

Inputs are what run_device.sh brings back: the corpus manifest, the teacher's training_summary.json,
the distill_summary.json of the distilled draft and of the cross-entropy baseline, and demo_eval.json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _load(path: str) -> dict:
    return json.loads(Path(path).read_text())


def _run(summary: dict) -> dict:
    """The reproducible part of a training summary: options without scratch paths, train stats, curve."""
    options = {k: v for k, v in summary["options"].items() if k not in ("data", "out", "tokenizer")}
    return {"options": options, "device": summary["device"], "train": summary["train"],
            "curve_columns": ["step", "seconds", "loss", "kl", "ce"], "curve": summary["curve"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    for name in ("manifest", "teacher", "distilled", "baseline", "eval", "out"):
        p.add_argument(f"--{name}", required=True)
    args = p.parse_args()
    teacher, evaluation = _load(args.teacher), _load(args.eval)
    manifest = {k: v for k, v in _load(args.manifest).items() if k != "options"}
    result = {
        "date": evaluation["date"],
        "hardware": teacher["device"],
        "corpus": manifest,
        "teacher_training": {**_run(teacher), "params": teacher["params"]},
        "draft_distilled_training": _run(_load(args.distilled)),
        "draft_ce_baseline_training": _run(_load(args.baseline)),
        "heldout_eval": evaluation,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, entry in evaluation["models"].items():
        agreement = entry.get("agreement", {})
        print(f"{name:12s} params {entry['params']:>10,}  held-out ppl {entry['heldout']['perplexity']:.3f}  "
              f"accepted/4 {agreement.get('mean_accepted', float('nan')):.3f}")


if __name__ == "__main__":
    main()

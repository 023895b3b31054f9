"""W1 over scheduler settings, in one process: the engine's defaults against a grid (issue #9).

    python -m lamina.bench.w1_sweep --result-file w1_sweep.json      # H200: ~10 engines, ~3 min
    python -m lamina.bench.w1_sweep --dry-run                        # CPU, tiny shape, 2 grid points

Rows: `LLM(model)` defaults at temperature 0.6 (the headline: what users run), greedy, and temperature 0.6
with top-p 0.95; then each (max_num_seqs, max_num_batched_tokens) of the grid at temperature 0.6; then the
defaults at 0.6 once more (the first row runs right after the process's first compiles and GPU warm-up).
Prints a table last, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from lamina.bench.offline import W1_EXPECTED_OUTPUT_TOKENS, make_llm, parse_args, run_w1, w1_requests, write_config

GRID = [(128, 2048), (256, 4096), (256, 8192), (256, 16384), (384, 8192), (512, 8192), (512, 16384)]
DEFAULT_ROWS = [("defaults, T 0.6", 0.6, 1.0), ("defaults, greedy", 0.0, 1.0),
                ("defaults, T 0.6 top-p 0.95", 0.6, 0.95)]


def rows_to_run(dry_run: bool) -> list[tuple[str, float, float, int | None, int | None]]:
    """(label, temperature, top_p, max_num_seqs, max_num_batched_tokens); None: the engine's default."""
    grid = [(4, 64), (8, 128)] if dry_run else GRID
    return ([(label, t, p, None, None) for label, t, p in DEFAULT_ROWS]
            + [(f"{seqs} / {tokens}, T 0.6", 0.6, 1.0, seqs, tokens) for seqs, tokens in grid]
            + [("defaults, T 0.6 (again, last)", 0.6, 1.0, None, None)])  # the first engine ran cold


def run_row(config_path: Path, args: argparse.Namespace, row: tuple) -> dict[str, Any]:
    label, temperature, top_p, seqs, tokens = row
    args.max_num_seqs, args.max_num_batched_tokens = seqs, tokens
    prompts, outputs = w1_requests(args.num_requests, args.max_len)
    result = run_w1(make_llm(config_path, args), prompts, outputs, temperature, top_p, trace=False)
    if not args.dry_run:
        assert result["output_tokens"] == W1_EXPECTED_OUTPUT_TOKENS, result
    return {"label": label, **result}


def print_table(rows: list[dict[str, Any]]) -> None:
    best = max(r["tok_per_s"] for r in rows if r["temperature"] == 0.6 and r["top_p"] == 1.0)
    print("\nW1 sweep | max_num_seqs / budget | temperature | top_p | tok/s | s | of best T 0.6 | preemptions")
    for r in rows:
        print(f"{r['label']} | {r['max_num_seqs']} / {r['max_num_batched_tokens']} | {r['temperature']} | "
              f"{r['top_p']} | {r['tok_per_s']:.0f} | {r['seconds']:.2f} | {r['tok_per_s'] / best:.3f} | "
              f"{r['preemptions']}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(["--workload", "w1", *argv])
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        config_path = write_config(args.shape, workdir)
        for row in tqdm(rows_to_run(args.dry_run), desc="W1 sweep", unit="engine"):
            rows.append(run_row(config_path, args, row))
    if args.result_file:
        Path(args.result_file).write_text(json.dumps({"command": "python -m lamina.bench.w1_sweep " + " ".join(argv),
                                                      "rows": rows}, indent=1))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

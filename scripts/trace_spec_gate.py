"""What the speculation gate saw (issue #12): the closed loop at each concurrency, n-gram (default) against off, and
every window the gate measured, summarised per batch bucket and arm.

    PYTHONPATH=. python scripts/trace_spec_gate.py [--concurrency 8,128] [--new-tokens 256] [--repeats 2]
                                                   [--result-file trace.json]

Per row: both engines' tok/s and their ratio; per bucket and arm of the n-gram engine's gate: windows, the median
window rate (tok/s), tokens and milliseconds per counted step; the bucket's state at the end.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.concurrency import closed_loop_requests, steady_throughput
from lamina.bench.spec import CLOSED_LOOP_REQUESTS, PROMPT_SETS
from lamina.engine.spec_gate import Bucket, WindowRecord


def summarise(windows: list[WindowRecord]) -> list[dict]:
    groups: dict[tuple[Bucket, str], list[WindowRecord]] = {}
    for w in windows:
        if w.recorded:
            groups.setdefault((w.bucket, w.arm.value), []).append(w)
    return [{"bucket": bucket.label, "arm": arm, "windows": len(ws),
             "rate": statistics.median(w.tokens / w.seconds for w in ws),
             "tokens_per_step": statistics.median(w.tokens / w.counted for w in ws),
             "ms_per_step": statistics.median(1000 * w.seconds / w.counted for w in ws)}
            for (bucket, arm), ws in sorted(groups.items())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="8,32,128,256")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args()
    engine_args = {"kv_cache_memory_bytes": 4 << 30} if torch.cuda.is_available() else {}
    off = LLM(model=DEMO_MODEL, **engine_args)
    ngram = LLM(model=DEMO_MODEL, speculative_config={"method": "ngram"}, **engine_args)
    prompts = [p for ps in PROMPT_SETS.values() for p in ps]
    for llm in (off, ngram):
        llm.generate(prompts, SamplingParams(max_tokens=8), use_tqdm=False)
    gate = ngram.engine.speculator.gate
    rows = []
    for repeat in range(args.repeats):
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            requests = closed_loop_requests(prompts, CLOSED_LOOP_REQUESTS * concurrency, args.new_tokens, 0.6)
            tokens, seconds = steady_throughput(off.engine, requests, concurrency)
            gate.window_log = []
            spec_tokens, spec_seconds = steady_throughput(ngram.engine, requests, concurrency)
            windows, gate.window_log = gate.window_log, None
            row = {"repeat": repeat, "concurrency": concurrency, "off_tok_s": tokens / seconds,
                   "ngram_tok_s": spec_tokens / spec_seconds, "windows": summarise(windows)}
            row["ratio"] = row["ngram_tok_s"] / row["off_tok_s"]
            rows.append(row)
            print(f"repeat {repeat} concurrency {concurrency}: off {row['off_tok_s']:.0f} ngram "
                  f"{row['ngram_tok_s']:.0f} tok/s ({row['ratio']:.2f}x)")
            for s in row["windows"]:
                print(f"    bucket {s['bucket']:>12s} {s['arm']:5s} windows {s['windows']:3d} rate {s['rate']:9.0f} "
                      f"tokens/step {s['tokens_per_step']:7.1f} ms/step {s['ms_per_step']:6.2f}")
    state = {bucket.label: s.as_dict() for bucket, s in sorted(gate.buckets.items())}
    for bucket, s in state.items():
        print(f"  gate bucket {bucket}: {s}")
    if args.result_file:
        Path(args.result_file).write_text(json.dumps({"rows": rows, "gate": state}, indent=1))
    for llm in (off, ngram):
        llm.engine.check_integrity()
    return 0


if __name__ == "__main__":
    sys.exit(main())

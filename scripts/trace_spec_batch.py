"""Where a fixed batch loses time with speculation on (issue #12): B seeded prompts at temperature 0.6 generated
together (lamina.bench.spec's throughput row), n-gram (default; "fixed": k = 7, no policy) against off, every step
recorded; per engine and number of rows in the step: steps, mean ms per step of each kind, tokens per step; the
first verify steps' times.

    PYTHONPATH=. python scripts/trace_spec_batch.py [--batch-sizes 8,32] [--new-tokens 256] [--repeats 2]
                                                    [--result-file F]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lamina import DEMO_MODEL, LLM, SamplingParams  # noqa: E402
from lamina.bench.spec import PROMPT_SETS  # noqa: E402


def run_batch(llm: LLM, size: int, new_tokens: int) -> dict:
    everything = [p for prompts in PROMPT_SETS.values() for p in prompts]
    prompts = list(itertools.islice(itertools.cycle(everything), size))
    params = [SamplingParams(temperature=0.6, max_tokens=new_tokens, ignore_eos=True, seed=i) for i in range(size)]
    llm.engine.step_log = []
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    steps, llm.engine.step_log = llm.engine.step_log, None
    by_rows: dict[tuple[int, str], list] = {}
    for step in steps:
        by_rows.setdefault((step.num_rows, step.kind), []).append(step)
    rows = [dict(rows=r, kind=kind, steps=len(s), ms=1000 * sum(x.seconds for x in s) / len(s),
                 tokens=sum(x.num_tokens for x in s) / len(s)) for (r, kind), s in sorted(by_rows.items())]
    verify_ms = [round(1000 * x.seconds, 3) for x in steps if x.kind == "verify"]
    return dict(tok_s=sum(len(o.outputs[0].token_ids) for o in outs) / seconds, seconds=seconds,
                in_steps_s=sum(x.seconds for x in steps), rows=rows, first_verify_ms=verify_ms[:8])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="8,32")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--result-file", type=Path)
    args = parser.parse_args()
    engine_args = {"kv_cache_memory_bytes": 4 << 30} if torch.cuda.is_available() else {}
    engines = {"off": LLM(model=DEMO_MODEL, **engine_args),
               "ngram": LLM(model=DEMO_MODEL, speculative_config={"method": "ngram"}, **engine_args),
               "fixed": LLM(model=DEMO_MODEL, speculative_config={"method": "ngram", "adaptive": False},
                            **engine_args)}
    for llm in engines.values():  # warm-up
        run_batch(llm, 8, 16)
    report = []
    for repeat, size in itertools.product(range(args.repeats), (int(b) for b in args.batch_sizes.split(","))):
        for name, llm in engines.items():
            result = dict(repeat=repeat, batch=size, engine=name, **run_batch(llm, size, args.new_tokens))
            report.append(result)
            print(f"batch {size} {name:6s} {result['tok_s']:9.0f} tok/s  {result['seconds'] * 1e3:8.1f} ms "
                  f"({result['in_steps_s'] * 1e3:.1f} in steps)")
            for row in result["rows"]:
                print(f"    rows {row['rows']:3d} {row['kind']:13s} {row['steps']:5d} steps  {row['ms']:7.3f} ms  "
                      f"{row['tokens']:6.1f} tokens")
            if result["first_verify_ms"]:
                print(f"    first verify steps (ms): {result['first_verify_ms']}")
    if args.result_file:
        args.result_file.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

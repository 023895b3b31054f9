"""Where a batch-1 step's host time goes, with and without n-gram speculation (issue #12).

    python scripts/profile_spec.py [--model DIR] [--new-tokens 512] [--top 30]

One long greedy and one T=0.6 generation per engine under cProfile; prints each engine's step times by kind
(from the engine's step log) and the functions with the most own time.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from lamina import DEMO_MODEL, LLM, SamplingParams

PROMPT = "def fibonacci(n):\n"


def profile(label: str, spec: dict | None, args: argparse.Namespace) -> None:
    llm = LLM(model=args.model, speculative_config=spec, gpu_memory_utilization=0.3)
    llm.generate([PROMPT], SamplingParams(max_tokens=16), use_tqdm=False)
    for temperature in (0.0, 0.6):
        params = SamplingParams(temperature=temperature, max_tokens=args.new_tokens, ignore_eos=True, seed=0)
        llm.engine.step_log = []
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
        profiler.disable()
        seconds = time.perf_counter() - start
        kinds: dict[str, list[float]] = {}
        for step in llm.engine.step_log:
            kinds.setdefault(step.kind, []).append(step.seconds)
        steps = ", ".join(f"{k} {len(v)} x {1000 * sum(v) / len(v):.3f} ms" for k, v in kinds.items())
        print(f"== {label} T={temperature}: {len(out.token_ids) / seconds:.0f} tok/s (under cProfile); {steps}")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
    llm.engine.executor.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    profile("off", None, args)
    profile("ngram k=3", {"method": "ngram", "num_speculative_tokens": 3, "adaptive": False}, args)


if __name__ == "__main__":
    main()

"""Where the host's time goes in W2 decode (batch 1): cProfile over the engine loop and the time spent in
Python's garbage collector, for the tree on PYTHONPATH. Issue #11's before/after check.

    PYTHONPATH=TREE python scripts/profile_w2_host.py [--shape qwen3-0.6b] [--tokens 256]
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import tempfile
import time
from pathlib import Path

from lamina.bench.offline import decode_timing, make_llm, parse_args, write_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--tokens", type=int, default=256)
    ours = parser.parse_args()
    args = parse_args(["--workload", "w2", "--shape", ours.shape])
    prompt = [(7 * i + 3) % 10000 for i in range(args.w2_prompt_len)]
    with tempfile.TemporaryDirectory() as workdir:
        llm = make_llm(write_config(ours.shape, Path(workdir)), args)
        decode_timing(llm, prompt, ours.tokens)  # warm
        collections = []
        gc.callbacks.append(lambda phase, info: collections.append((phase, info["generation"], time.perf_counter())))
        first, last, produced = decode_timing(llm, prompt, ours.tokens)
        plain = (last - first) / (produced - 1) * 1e6
        gc_s = sum(t2 - t1 for (p1, g, t1), (p2, _, t2) in zip(collections[::2], collections[1::2]))
        profile = cProfile.Profile()
        profile.enable()
        first, last, produced = decode_timing(llm, prompt, ours.tokens)
        profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())
    print(f"us per decode step: {plain:.1f} (profiled {(last - first) / (produced - 1) * 1e6:.1f}); "
          f"gc: {len(collections) // 2} collections, {gc_s * 1e3:.2f} ms in the unprofiled run")


if __name__ == "__main__":
    main()

"""Where a batch-1 decode step spends its time on the GPU (W2 shape, dummy weights, CUDA graphs).

    python scripts/profile_decode.py [--shape qwen3-0.6b] [--steps 32]

Runs torch.profiler over `--steps` decode steps after a warm-up and prints the top ops by CUDA time
and by CPU time, plus wall ms per step and how much of it the host spends waiting for the device's
tokens, so host overhead and GPU time can be told apart.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lamina import LLM, SamplingParams  # noqa: E402
from lamina.bench.offline import StepTrace, write_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(args.shape, tmp)
        llm = LLM(model=str(config), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                  device="cuda", max_model_len=4096)
        engine = llm.engine
        engine.add_request({"prompt_token_ids": list(range(1, 129))},
                           SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True), request_id="0")
        for _ in range(20):  # prefill + warm decode steps
            engine.step()
        torch.cuda.synchronize()
        trace = StepTrace(engine)  # per step: wall time and the host's wait for the device's tokens
        start = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / args.steps * 1e3
        trace.close()
        print(f"wall ms/step (no profiler): {wall:.3f}, of which the host waits for the device "
              f"{sum(step.device_wait_s for step in trace.steps) / args.steps * 1e3:.3f} "
              f"(async_scheduling={engine.config.async_scheduling})")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                engine.step()
            torch.cuda.synchronize()
        averages = prof.key_averages()
        print(averages.table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
        print(averages.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=60))
        engine.abort_request("0")


if __name__ == "__main__":
    main()

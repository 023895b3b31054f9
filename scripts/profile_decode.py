"""Where a batch-1 decode step spends its time on the GPU (W2 shape, dummy weights, CUDA graphs).

    python scripts/profile_decode.py [--shape qwen3-0.6b] [--steps 32] [--scheme bf16|int4|int8|fp8]
                                     [--batch 1] [--prompt-len 128] [--kv-cache-dtype auto] [--result-file F]
                                     [--no-enable-pdl]

Runs torch.profiler over `--steps` decode steps after a warm-up and prints the top ops by CUDA time
and by CPU time, plus wall ms per step and how much of it the host spends waiting for the device's
tokens, so host overhead and GPU time can be told apart. --scheme quantizes every linear layer (int4: RTN
group 128, int8: weight-only, both with the LM head, as lamina.bench.quant_speed; fp8: W8A8, as
lamina.bench.w8a8_speed); --batch / --prompt-len profile a batch mid-W1 (e.g. 128 requests at ~1,000 tokens);
the result file holds each kernel's time per step. With PDL (the default) a kernel starts while the one before
it runs, so its time includes that wait; --no-enable-pdl gives each kernel's own time.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lamina import LLM, SamplingParams  # noqa: E402
from lamina.bench.offline import StepTrace  # noqa: E402
from lamina.bench.quant_speed import quantized_config  # noqa: E402
from lamina.bench.w8a8_speed import scheme_config  # noqa: E402


def model_config(shape: str, scheme: str, directory: str) -> Path:
    if scheme == "fp8":
        return scheme_config(shape, Path(directory), scheme)
    return quantized_config(shape, Path(directory), None if scheme == "bf16" else scheme)


def kernel_times(averages, steps: int) -> list[dict]:  # noqa: ANN001 - torch.profiler's EventList
    """Device time per step of every kernel name (ms), largest first."""
    rows = [dict(name=e.key, ms_per_step=e.device_time_total / 1e3 / steps, calls_per_step=e.count / steps)
            for e in averages if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    return sorted(rows, key=lambda r: -r["ms_per_step"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--scheme", default="bf16", choices=["bf16", "int4", "int8", "fp8"])
    parser.add_argument("--batch", type=int, default=1, help="requests decoding together")
    parser.add_argument("--prompt-len", type=int, default=128, help="each request's context when profiled, ~")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--result-file", type=Path)
    parser.add_argument("--no-enable-pdl", dest="enable_pdl", action="store_false",
                        help="the engine argument enable_pdl=False (kernels launched without PDL)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = model_config(args.shape, args.scheme, tmp)
        llm = LLM(model=str(config), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                  device="cuda", max_model_len=4096, kv_cache_dtype=args.kv_cache_dtype,
                  enable_pdl=args.enable_pdl)
        engine = llm.engine
        for i in range(args.batch):
            engine.add_request({"prompt_token_ids": [(7 * t + i) % 10000 + 1 for t in range(args.prompt_len)]},
                               SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True), request_id=str(i))
        engine.step_log = []
        while not engine.step_log or engine.step_log[-1].num_tokens != args.batch:
            engine.step()  # every prompt's prefill, until a step decodes one token a request
        engine.step_log = None
        for _ in range(20):  # warm decode steps
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
        kernels = kernel_times(averages, args.steps)
        device_ms, calls = sum(k["ms_per_step"] for k in kernels), sum(k["calls_per_step"] for k in kernels)
        print(f"{args.scheme}, batch {args.batch}, kv {args.kv_cache_dtype}: device time per step {device_ms:.3f} "
              f"ms in {calls:.0f} kernels; wall {wall:.3f} ms")
        for k in kernels[:25]:
            print(f"  {k['ms_per_step']:8.4f} ms  {k['calls_per_step']:5.1f}x  {k['name'][:90]}")
        if args.result_file:
            args.result_file.write_text(json.dumps(dict(shape=args.shape, scheme=args.scheme, batch=args.batch,
                                                         prompt_len=args.prompt_len, kv=args.kv_cache_dtype,
                                                         enable_pdl=args.enable_pdl,
                                                         wall_ms=wall, kernels=kernels), indent=1))
        for i in range(args.batch):
            engine.abort_request(str(i))


if __name__ == "__main__":
    main()

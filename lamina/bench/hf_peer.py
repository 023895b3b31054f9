"""The HF transformers peer of `lamina.bench.offline`, on random weights of the same config.

W1: continuous batching (`init_continuous_batching`, one request per prompt with its own
max_new_tokens, greedy), one warm-up request before the clock. W2: `generate` with a static cache,
which makes generate `torch.compile` its decode forward (compile_config: fullgraph, reduce-overhead;
on CUDA only): the first call (compilation + warm-up) is timed on its own,
then a warm call; a streamer stamps each token, decode tok/s = (n - 1) / (last - first).
The config has no eos_token_id, so every request runs to its max_new_tokens (ignore_eos).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from lamina.bench.offline import w1_requests


def load_hf_model(config_path: Path, args: argparse.Namespace) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(str(config_path.parent))
    dtype = getattr(torch, args.dtype)
    with torch.device(args.device):  # random init on the GPU: fast, and no 16 GB host copy
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def run_hf(config_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    import transformers
    model = load_hf_model(config_path, args)
    row = run_hf_w1(model, args) if args.workload == "w1" else run_hf_w2(model, args)
    return dict(name=f"hf transformers {transformers.__version__}", **row)


def _cb_results(manager: Any, ids: list[str], desc: str | None = None) -> int:
    """Wait for every request of `ids`; their generated tokens. With `desc`, a progress bar of requests."""
    from tqdm.auto import tqdm

    tokens, pending = 0, set(ids)
    with tqdm(total=len(ids), desc=desc, unit="req", disable=desc is None) as bar:
        while pending:
            result = manager.get_result(timeout=1)
            if result is not None and result.request_id in pending:
                if result.error:
                    raise RuntimeError(f"HF continuous batching: {result.error}")
                pending.discard(result.request_id)
                tokens += len(result.generated_tokens)
                bar.update(1)
    return tokens


@torch.inference_mode()
def run_hf_w1(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import GenerationConfig
    prompts, outputs = w1_requests(args.num_requests, args.max_len)
    config = GenerationConfig(do_sample=False, max_new_tokens=max(outputs), eos_token_id=None, pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=config)
    manager.start()
    try:
        warm = manager.add_request(prompts[0], request_id="warmup", max_new_tokens=16)
        _cb_results(manager, [warm])
        start = time.perf_counter()
        ids = [manager.add_request(p, request_id=f"r{i}", max_new_tokens=n)
               for i, (p, n) in enumerate(zip(prompts, outputs))]
        tokens = _cb_results(manager, ids, desc="HF W1")
        seconds = time.perf_counter() - start
    finally:
        manager.stop(block=True)
    return dict(api="init_continuous_batching", output_tokens=tokens, seconds=seconds, tok_per_s=tokens / seconds)


class _Stamps:
    """A generate streamer that records when each token arrives (the first put is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


@torch.inference_mode()
def run_hf_w2(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import CompileConfig
    compiled = args.device == "cuda"
    prompt = torch.tensor([[(7 * i + 3) % 10000 for i in range(args.w2_prompt_len)]], device=args.device)
    kwargs = dict(max_new_tokens=args.w2_new_tokens, min_new_tokens=args.w2_new_tokens, do_sample=False)
    if compiled:  # generate compiles the decode forward itself when the cache is static (on CUDA)
        kwargs.update(cache_implementation="static",
                      compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead"))

    def once() -> tuple[float, list[float]]:
        stamps, start = _Stamps(), time.perf_counter()
        out = model.generate(prompt, streamer=stamps, **kwargs)
        assert out.shape[1] == args.w2_prompt_len + args.w2_new_tokens, out.shape
        return time.perf_counter() - start, stamps.times[1:]

    compile_s, _ = once()  # compilation (cuda) + warm-up
    _, times = once()
    tok_s = (len(times) - 1) / (times[-1] - times[0])
    return dict(api="generate static cache + torch.compile" if compiled else "generate (eager, dynamic cache)",
                decode_tok_per_s=tok_s, compile_s=compile_s)

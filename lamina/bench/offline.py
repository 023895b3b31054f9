"""W1 (offline throughput) and W2 (batch-1 decode) on dummy weights of real model shapes.

    python -m lamina.bench.offline --workload w1 --shape qwen3-0.6b --peer hf --result-file w1.json
    python -m lamina.bench.offline --workload w2 --shape llama3-8b --peer hf --result-file w2.json
    python -m lamina.bench.offline --workload w1 --dry-run     # CPU, tiny shape, few requests
    python -m lamina.bench.offline --workload w2 --no-enable-pdl   # the same tree with PDL off (an A/B)

The shape's config.json is written to a temp dir and loaded with load_format="dummy" (random
weights: speed does not depend on their values). See ../shared/BENCHMARKS.md for the workloads.
W1: 256 requests drawn with Python's random.seed(0), one warm-up request before the clock,
throughput = output tokens / wall seconds of the generate call. W2: a 128-token prompt, 256 greedy
tokens; decode tok/s = 255 / (last token - first token), against the ceiling bytes(weights) / 4.63 TB/s,
and start-up (engine construction + first request) to first token. Prints a table last, writes JSON.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lamina import LLM, SamplingParams

CEILING_BYTES_PER_S = 4.63e12
W1_EXPECTED_OUTPUT_TOKENS = 133_966
_COMMON = dict(hidden_act="silu", attention_bias=False, rms_norm_eps=1e-6, torch_dtype="bfloat16")
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                       rope_theta=1_000_000.0, max_position_embeddings=40960, use_sliding_window=False),
    "llama3-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False,
                      rope_theta=500_000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
                      rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                        high_freq_factor=4.0, original_max_position_embeddings=8192)),
    # --dry-run: Qwen3 layout, tiny (vocab > 10000 so W1's token ids are valid)
    "tiny": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=10240, tie_word_embeddings=True, rope_theta=1_000_000.0,
                 max_position_embeddings=4096, use_sliding_window=False),
}


def write_config(shape: str, directory: str | Path) -> Path:
    """config.json of `shape` (no eos_token_id: every request runs to its max_tokens) in `directory`."""
    path = Path(directory) / "config.json"
    path.write_text(json.dumps({**_COMMON, **SHAPES[shape]}, indent=1))
    return path


def w1_requests(num_requests: int = 256, max_len: int = 1024, seed: int = 0,
                ) -> tuple[list[list[int]], list[int]]:
    """(prompts, output lengths): lengths uniform in [100, max_len], ids uniform in [0, 10000)."""
    rng = random.Random(seed)
    lo = min(100, max_len)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(lo, max_len))] for _ in range(num_requests)]
    outputs = [rng.randint(lo, max_len) for _ in range(num_requests)]
    return prompts, outputs


def release_memory() -> None:
    """Free the GPU memory of engines no longer referenced (the next one sizes its KV cache from what is free)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_llm(config_path: Path, args: argparse.Namespace, enforce_eager: bool = False) -> LLM:
    release_memory()
    return LLM(model=str(config_path), load_format="dummy", skip_tokenizer_init=True, dtype=args.dtype,
               device=args.device, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens, enforce_eager=enforce_eager,
               kv_cache_memory_bytes=args.kv_cache_memory_bytes, kv_cache_dtype=args.kv_cache_dtype,
               enable_pdl=args.enable_pdl)


def weight_bytes(llm: LLM) -> int:
    return sum(p.numel() * p.element_size() for p in llm.engine.executor.worker.model.parameters())


def run_w1(llm: LLM, prompts: list[list[int]], outputs: list[int], temperature: float = 0.6, top_p: float = 1.0,
           trace: bool = True) -> dict[str, Any]:
    """W1 at `temperature` / `top_p` (nano-vllm samples at 0.6), after one warm-up request."""
    warm = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=16, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0]}], warm, use_tqdm=False)
    params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=n, ignore_eos=True) for n in outputs]
    step_trace = StepTrace(llm.engine) if trace else None
    start = time.perf_counter()
    done = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    if step_trace is not None:
        step_trace.close()
    tokens = sum(len(o.outputs[0].token_ids) for o in done)
    sched = llm.engine.config.scheduler_config
    return dict(output_tokens=tokens, seconds=seconds, tok_per_s=tokens / seconds, requests=len(prompts),
                temperature=temperature, top_p=top_p, max_num_seqs=sched.max_num_seqs,
                max_num_batched_tokens=sched.max_num_batched_tokens, preemptions=llm.engine.get_stats().num_preemptions,
                steps=step_trace.summary() if step_trace else None)


class StepTrace:
    """The engine's own step log (LLMEngine.step_log: each step's kind, tokens, wall time, the host's wait
    for the device and the Triton kernels compiled), on while it is open. close() turns it off."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.steps: list = []
        engine.step_log = self.steps

    def close(self) -> None:
        self.engine.step_log = None

    def summary(self) -> dict[str, Any]:
        prefills = [dict(tokens=s.num_tokens, rows=s.num_rows, seconds=round(s.seconds, 4))
                    for s in self.steps if s.kind == "prefill"]
        compiles = [dict(kind=s.kind, tokens=s.num_tokens, rows=s.num_rows, compiles=s.compiles)
                    for s in self.steps if s.compiles]
        out: dict[str, Any] = {"triton_compiles": sum(s.compiles for s in self.steps),
                               "steps_that_compiled": compiles, "prefill_steps": prefills}
        for kind in ("prefill", "decode", "decode ahead", "verify"):
            steps = [s for s in self.steps if s.kind == kind]
            out[kind] = dict(steps=len(steps), seconds=round(sum(s.seconds for s in steps), 3),
                             device_wait_s=round(sum(s.device_wait_s for s in steps), 3),
                             slowest_s=round(max((s.seconds for s in steps), default=0.0), 3))
        return out


def decode_timing(llm: LLM, prompt: list[int], new_tokens: int) -> tuple[float, float, int]:
    """(time of the first token, of the last, tokens) for one request, stepping the engine directly."""
    return batch_decode_timing(llm, [prompt], new_tokens)


def batch_decode_timing(llm: LLM, prompts: list[list[int]], new_tokens: int) -> tuple[float, float, int]:
    """(time of the step that gave every request its first token, of the last step, tokens of the last request
    to finish) for `prompts` generated together, greedy, stepping the engine directly."""
    engine = llm.engine
    for prompt in prompts:
        engine.add_request({"prompt_token_ids": prompt},
                           SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    first = last = None
    produced, started = 0, set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            produced = len(out.outputs[0].token_ids)
            last = time.perf_counter()
            started.add(out.request_id)
        if first is None and len(started) == len(prompts):
            first = last
    return first, last, produced


def run_w2(config_path: Path, args: argparse.Namespace, enforce_eager: bool = False) -> dict[str, Any]:
    prompt = [(7 * i + 3) % 10000 for i in range(args.w2_prompt_len)]
    start = time.perf_counter()
    llm = make_llm(config_path, args, enforce_eager)
    init_s = time.perf_counter() - start
    first_token_at, _, _ = decode_timing(llm, prompt, 2)
    startup_to_first_token = first_token_at - start
    first, last, produced = decode_timing(llm, prompt, args.w2_new_tokens)
    assert produced == args.w2_new_tokens, produced
    tok_s = (produced - 1) / (last - first)
    ceiling = CEILING_BYTES_PER_S / weight_bytes(llm)
    return dict(decode_tok_per_s=tok_s, ceiling_tok_per_s=ceiling, ceiling_frac=tok_s / ceiling,
                startup_s=init_s, startup_to_first_token_s=startup_to_first_token,
                enforce_eager=enforce_eager, cuda_graphs=llm.engine.executor.worker.runner.graphs is not None,
                kv_capacity_tokens=llm.engine.kv_capacity_tokens)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--workload", choices=("w1", "w2"), required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--peer", choices=("hf", "none"), default="none")
    parser.add_argument("--result-file", default=None)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, 8 short requests")
    parser.add_argument("--also-eager", action="store_true", help="W2: also run lamina with enforce_eager")
    parser.add_argument("--temperature", type=float, default=0.6, help="W1 sampling temperature (0 = greedy)")
    parser.add_argument("--top-p", type=float, default=1.0, help="W1 top-p")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: the engine's for the device")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="default: the engine's for the device")
    parser.add_argument("--max-model-len", type=int, default=None, help="default: the engine's")
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8 (the engine argument)")
    parser.add_argument("--no-enable-pdl", dest="enable_pdl", action="store_false",
                        help="the engine argument enable_pdl=False (kernels launched without PDL)")
    args = parser.parse_args(argv)
    args.command = "python -m lamina.bench.offline " + " ".join(argv if argv is not None else sys.argv[1:])
    args.num_requests, args.max_len, args.w2_prompt_len, args.w2_new_tokens = 256, 1024, 128, 256
    args.dtype, args.device, args.kv_cache_memory_bytes = "bfloat16", "cuda", None
    if args.dry_run:
        args.shape, args.num_requests, args.max_len, args.w2_prompt_len, args.w2_new_tokens = "tiny", 8, 40, 16, 12
        args.dtype, args.device, args.kv_cache_memory_bytes = "float32", "cpu", 1 << 26
        args.max_num_seqs, args.max_num_batched_tokens, args.max_model_len = 8, 128, 256
    return args


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    config_path = write_config(args.shape, workdir)
    report: dict[str, Any] = dict(workload=args.workload, shape=args.shape, command=args.command,
                                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                  hardware=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                                  torch=torch.__version__)
    if args.workload == "w1":
        prompts, outputs = w1_requests(args.num_requests, args.max_len)
        report["lamina"] = run_w1(make_llm(config_path, args), prompts, outputs, args.temperature, args.top_p)
        if not args.dry_run:
            assert report["lamina"]["output_tokens"] == W1_EXPECTED_OUTPUT_TOKENS, report["lamina"]
    else:
        report["lamina"] = run_w2(config_path, args)
        if args.also_eager:
            report["lamina_eager"] = run_w2(config_path, args, enforce_eager=True)
    if args.peer == "hf":
        from lamina.bench.hf_peer import run_hf
        release_memory()
        report["peer"] = run_hf(config_path, args)
    return report


def print_table(report: dict[str, Any]) -> None:
    keys = ("tok_per_s", "output_tokens", "seconds", "decode_tok_per_s", "ceiling_frac", "startup_s",
            "startup_to_first_token_s", "compile_s", "cuda_graphs")
    print(f"\n{report['workload'].upper()} {report['shape']} on {report['hardware']}")
    print("engine | " + " | ".join(keys))
    for name in ("lamina", "lamina_eager", "peer"):
        row = report.get(name)
        if row:
            cells = [f"{row[k]:.4g}" if isinstance(row.get(k), float) else str(row.get(k, "")) for k in keys]
            print(f"{row.get('name', name)} | " + " | ".join(cells))
    steps = dict(report.get("lamina", {}).get("steps") or {})
    compiles = steps.pop("triton_compiles", 0)
    compiling = steps.pop("steps_that_compiled", [])
    steps.pop("prefill_steps", None)
    if compiles:
        where = (f"{s['kind']} of {s['tokens']} tokens / {s['rows']} rows: {s['compiles']}" for s in compiling)
        print(f"\n{compiles} Triton compiles during the run, in steps: " + "; ".join(where))
    if steps:
        print("\nsteps: " + "; ".join(f"{k}: {v['steps']} in {v['seconds']} s (host waiting for the device "
                                      f"{v['device_wait_s']} s, slowest {v['slowest_s']} s)"
                                      for k, v in steps.items()))


def run_in_scratch(args: argparse.Namespace, run_fn: Callable[[argparse.Namespace, Path], dict[str, Any]],
                   print_fn: Callable[[dict[str, Any]], None]) -> int:
    """A GPU bench's main: run it in a scratch directory (its model config lives there), write --result-file,
    print its table last."""
    with tempfile.TemporaryDirectory() as workdir:
        report = run_fn(args, Path(workdir))
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(report, indent=1))
    print_fn(report)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_in_scratch(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())

"""Tensor parallelism: TP=2 against TP=1 in one run, on dummy weights of real shapes (issue #14).

    python -m lamina.bench.tp --workload w2 --shape llama3-8b --tp 1 2 --result-file tp-w2-8b.json
    python -m lamina.bench.tp --workload w1 --shape llama3-8b --tp 1 2 --result-file tp-w1-8b.json
    python -m lamina.bench.tp --workload w2 --shape llama3-70b --tp 2 --result-file tp-w2-70b.json
    python -m lamina.bench.tp --workload w2 --dry-run        # CPU, tiny shape, TP 1 and 2 over gloo

Needs one GPU per rank (nvidia-h200-x2 for --tp 2). W2 (batch-1 decode of a 128-token prompt, 256 greedy
tokens) reports decode tokens/s, its speed-up over the first --tp size, and its fraction of the ceiling: the
bytes of weights one rank reads per step / 4.63 TB/s (each GPU reads its own shard, in parallel). W1 is
../shared/BENCHMARKS.md's offline workload. NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, set here for every rank). Prints a table last, writes JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lamina import LLM
from lamina.bench.offline import (CEILING_BYTES_PER_S, SHAPES, decode_timing, release_memory, run_in_scratch, run_w1,
                                  w1_requests, weight_bytes, write_config)

TP_SHAPES: dict[str, dict[str, Any]] = {
    **SHAPES,
    "llama3-70b": {**SHAPES["llama3-8b"], "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                   "num_attention_heads": 64, "num_key_value_heads": 8},
}


def make_llm(config_path: Path, args: argparse.Namespace, tp: int) -> LLM:
    release_memory()
    return LLM(model=str(config_path), load_format="dummy", skip_tokenizer_init=True, dtype=args.dtype,
               device=args.device, tensor_parallel_size=tp, max_model_len=args.max_model_len,
               kv_cache_memory_bytes=args.kv_cache_memory_bytes, max_num_seqs=args.max_num_seqs,
               max_num_batched_tokens=args.max_num_batched_tokens)


def run_w2(llm: LLM, args: argparse.Namespace) -> dict[str, Any]:
    prompt = [(7 * i + 3) % 10000 for i in range(args.w2_prompt_len)]
    decode_timing(llm, prompt, 4)  # warm-up
    first, last, produced = decode_timing(llm, prompt, args.w2_new_tokens)
    tok_s = (produced - 1) / (last - first)
    ceiling = CEILING_BYTES_PER_S / weight_bytes(llm)  # weight_bytes: rank 0's shard
    return dict(decode_tok_per_s=tok_s, ceiling_tok_per_s=ceiling, ceiling_frac=tok_s / ceiling,
                cuda_graphs=llm.engine.executor.worker.runner.graphs is not None,
                kv_capacity_tokens=llm.engine.kv_capacity_tokens)


def run_one(config_path: Path, args: argparse.Namespace, tp: int) -> dict[str, Any]:
    start = time.perf_counter()
    llm = make_llm(config_path, args, tp)
    row: dict[str, Any] = dict(tensor_parallel_size=tp, startup_s=time.perf_counter() - start,
                               rank0_weight_bytes=weight_bytes(llm))
    try:
        if args.workload == "w2":
            row.update(run_w2(llm, args))
        else:
            prompts, outputs = w1_requests(args.num_requests, args.max_len)
            row.update(run_w1(llm, prompts, outputs, args.temperature, trace=False))
    finally:
        llm.shutdown()
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--workload", choices=("w1", "w2"), required=True)
    parser.add_argument("--shape", choices=sorted(TP_SHAPES), default="llama3-8b")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2], help="tensor_parallel_size values, in order")
    parser.add_argument("--result-file", default=None)
    parser.add_argument("--dry-run", action="store_true", help="CPU (gloo), tiny shape, short requests")
    parser.add_argument("--temperature", type=float, default=0.6, help="W1 sampling temperature")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    args = parser.parse_args(argv)
    args.command = "python -m lamina.bench.tp " + " ".join(argv if argv is not None else sys.argv[1:])
    args.num_requests, args.max_len, args.w2_prompt_len, args.w2_new_tokens = 256, 1024, 128, 256
    args.dtype, args.device, args.kv_cache_memory_bytes = "bfloat16", "cuda", None
    if args.shape == "llama3-70b" and args.max_model_len is None:
        args.max_model_len = 8192  # the KV cache left next to 70 GB of weights per GPU
    if args.dry_run:
        args.shape, args.num_requests, args.max_len, args.w2_prompt_len, args.w2_new_tokens = "tiny", 8, 40, 16, 12
        args.dtype, args.device, args.kv_cache_memory_bytes = "float32", "cpu", 1 << 26
        args.max_num_seqs, args.max_num_batched_tokens, args.max_model_len = 8, 128, 256
    return args


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on the lent machines
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    config_path = Path(workdir) / "config.json"
    write_config("tiny" if args.shape == "tiny" else "llama3-8b", workdir)
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **TP_SHAPES[args.shape]}, indent=1))
    rows = [run_one(config_path, args, tp) for tp in args.tp]
    key = "decode_tok_per_s" if args.workload == "w2" else "tok_per_s"
    for row in rows:
        row["speedup_vs_first"] = row[key] / rows[0][key]
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    return dict(workload=args.workload, shape=args.shape, command=args.command, rows=rows,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                hardware=f"{gpus} x {torch.cuda.get_device_name()}" if gpus else "cpu", torch=torch.__version__)


def print_table(report: dict[str, Any]) -> None:
    keys = ("tensor_parallel_size", "decode_tok_per_s", "tok_per_s", "speedup_vs_first", "ceiling_frac",
            "startup_s", "cuda_graphs")
    print(f"\n{report['workload'].upper()} {report['shape']} on {report['hardware']}")
    print(" | ".join(keys))
    for row in report["rows"]:
        print(" | ".join(f"{row[k]:.4g}" if isinstance(row.get(k), float) else str(row.get(k, "")) for k in keys))


def main(argv: list[str] | None = None) -> int:
    return run_in_scratch(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())

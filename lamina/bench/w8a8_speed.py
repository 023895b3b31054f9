"""W8A8 speed (issue #13): FP8 and int8 W8A8 against bf16 on the Llama-3-8B shape, dummy weights, one process.

    python -m lamina.bench.w8a8_speed [--schemes bf16,fp8,w8a8,fp8+kv8] [--result-file w8a8.json]  # one GPU, ~5 min
    python -m lamina.bench.w8a8_speed --tiny                                                         # CPU, tiny model

Every linear layer but the LM head is quantized as `lamina quantize --method fp8|w8a8` writes it (weights
per channel, activations per token at run time; llm-compressor's FP8_DYNAMIC / W8A8 leave lm_head alone too);
load_format="dummy" fills the weights (fp8 / int8 values and positive scales); `fp8+kv8` adds the fp8 KV cache
(kv_cache_dtype="fp8", scales calibrated at start-up). For each scheme, with the engine's defaults
(`LLM(model)`: chunked prefill, CUDA graphs):

  prefill   --prefill-requests prompts of --prompt-len tokens (4,096), max_tokens 1, all submitted at once:
            prompt tokens / s (time to the last first token), after one warm-up request
  W1        ../shared/BENCHMARKS.md's W1 requests (--w1-requests of them, prompts and outputs uniform in
            [100, 1024] tokens, temperature 0.6; lamina.bench.offline.run_w1): output tokens / s

Bars: FP8 prefill >= 1.3x bf16, FP8 W1 >= 1.15x bf16. Prints a table last, writes JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from lamina import LLM, SamplingParams
from lamina.bench.offline import release_memory, run_w1, w1_requests, write_config

SCHEMES = ("bf16", "fp8", "w8a8", "fp8+kv8")  # fp8+kv8: fp8 weights and the fp8 KV cache (kv_cache_dtype="fp8")
BARS = {"prefill": 1.3, "w1": 1.15}


def scheme_config(shape: str, directory: Path, scheme: str) -> Path:
    """config.json of `shape` with the quantization_config of recipe `scheme` (none for bf16)."""
    from lamina.quant.compressed_tensors import config_dict
    from lamina.quant.recipe import get_recipe

    path = write_config(shape, directory)
    if scheme != "bf16":
        recipe = get_recipe(scheme.removesuffix("+kv8"))
        config = json.loads(path.read_text())
        config["quantization_config"] = config_dict(recipe.weight_args(0), ["lm_head"], recipe.input_activations)
        path.write_text(json.dumps(config, indent=1))
    return path


def prefill_rate(llm: LLM, args: argparse.Namespace) -> dict[str, Any]:
    prompts = [[(31 * r + 7 * i + 3) % 10000 for i in range(args.prompt_len)] for r in range(args.prefill_requests)]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompts[0][::-1]}], params, use_tqdm=False)  # warm-up, no cache hit
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return dict(prompt_tokens=args.prompt_len * len(prompts), seconds=seconds,
                tok_per_s=args.prompt_len * len(prompts) / seconds)


def run_scheme(scheme: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    directory = workdir / scheme
    directory.mkdir()
    path = scheme_config(args.shape, directory, scheme)
    release_memory()
    start = time.perf_counter()
    llm = LLM(model=str(path), load_format="dummy", skip_tokenizer_init=True, dtype=args.dtype, device=args.device,
              max_model_len=args.max_model_len, kv_cache_dtype="fp8" if scheme.endswith("+kv8") else "auto",
              **args.engine)
    result: dict[str, Any] = dict(scheme=scheme, startup_s=time.perf_counter() - start)
    model = llm.engine.executor.worker.model
    result["weight_gb"] = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    result["prefill"] = prefill_rate(llm, args)
    prompts, outputs = w1_requests(args.w1_requests, args.w1_max_len)
    result["w1"] = run_w1(llm, prompts, outputs, trace=False)
    llm.engine.check_integrity()
    del llm, model
    release_memory()
    return result


def table(report: dict[str, Any]) -> str:
    rows = report["schemes"]
    base = next((r for r in rows if r["scheme"] == "bf16"), None)
    lines = [f"{'scheme':8} {'weights GB':>10} {'prefill tok/s':>14} {'vs bf16':>8} {'W1 tok/s':>10} {'vs bf16':>8}"]
    for row in rows:
        ratio = {k: row[k]["tok_per_s"] / base[k]["tok_per_s"] if base else float("nan") for k in BARS}
        lines.append(f"{row['scheme']:8} {row['weight_gb']:10.2f} {row['prefill']['tok_per_s']:14.0f} "
                     f"{ratio['prefill']:7.2f}x {row['w1']['tok_per_s']:10.0f} {ratio['w1']:7.2f}x")
    fp8 = next((r for r in rows if r["scheme"] == "fp8"), None)
    if base and fp8:
        for key, bar in BARS.items():
            ratio = fp8[key]["tok_per_s"] / base[key]["tok_per_s"]
            lines.append(f"bar: fp8 {key} >= {bar}x bf16: {ratio:.2f}x {'PASS' if ratio >= bar else 'FAIL'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CPU, a tiny model (times mean nothing)")
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--prompt-len", type=int, default=4096)
    parser.add_argument("--prefill-requests", type=int, default=16)
    parser.add_argument("--w1-requests", type=int, default=128)
    parser.add_argument("--result-file", default="w8a8_speed.json")
    args = parser.parse_args(argv)
    args.schemes = args.schemes.split(",")
    unknown = sorted(set(args.schemes) - set(SCHEMES))
    if unknown:
        parser.error(f"--schemes: {unknown} unknown; allowed: {list(SCHEMES)}")
    args.shape, args.dtype, args.device = "llama3-8b", "bfloat16", "cuda"
    args.max_model_len, args.w1_max_len = 8192, 1024
    args.engine = {}
    if args.tiny:
        args.shape, args.dtype, args.device, args.max_model_len, args.w1_max_len = "tiny", "float32", "cpu", 256, 24
        args.prompt_len, args.prefill_requests, args.w1_requests = 64, 2, 4
        args.engine = dict(num_kv_blocks=64, block_size=16)
    elif not torch.cuda.is_available():
        parser.error("no CUDA device: use --tiny")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report: dict[str, Any] = dict(workload="w8a8-speed", shape=args.shape, command=" ".join(sys.argv),
                                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                  device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                                  torch=torch.__version__, prompt_len=args.prompt_len,
                                  prefill_requests=args.prefill_requests, w1_requests=args.w1_requests, schemes=[])
    with tempfile.TemporaryDirectory() as workdir:
        for scheme in args.schemes:
            report["schemes"].append(run_scheme(scheme, args, Path(workdir)))
            Path(args.result_file).write_text(json.dumps(report, indent=1))
            print(f"{scheme}: prefill {report['schemes'][-1]['prefill']['tok_per_s']:.0f} tok/s, "
                  f"W1 {report['schemes'][-1]['w1']['tok_per_s']:.0f} tok/s", flush=True)
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

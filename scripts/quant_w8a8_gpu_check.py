"""W8A8 on a GPU (issue #13): do torch._int_mm / torch._scaled_mm compute what the reference path computes?

    python scripts/quant_w8a8_gpu_check.py [--device cuda] [--skip-models] [--result-file FILE]

1. GEMMs: int8 x int8 -> int32 through torch._int_mm (rows padded to 32 when M <= 16) against the exact float64
   reference, bit for bit; fp8 e4m3 (torch._scaled_mm row-wise, bf16 out, or lamina's Triton GEMM where the
   device's table routes it: the fp8_kernel column) against the float32 reference; times
   against a bf16 F.linear at 4096 x 4096.
2. Layers (bf16, random weights, inputs with a few outlier columns): W8A8 int8, LLM.int8(), FP8 and static FP8 layers on
   the fast path against the same layers on the reference path.
3. Models: the demo model quantized with each method (llm_int8, w8a8, smoothquant on 16 calibration sequences,
   fp8), run by lamina's engine in bf16 on the device (CUDA graphs on): greedy tokens of the fast path against
   the reference path and against the unquantized model.

Prints a table per part; writes JSON to --result-file, or to $OUT/quant_w8a8_gpu_check.json when OUT is set.
On a CPU (--device cpu) the fp8 GEMM has no fast path: part 1 then checks torch._int_mm alone.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lamina import DEMO_MODEL, LLM, SamplingParams  # noqa: E402
from lamina.layers import dispatch  # noqa: E402
from lamina.layers.linear import ReplicatedLinear  # noqa: E402
from lamina.quant import fp8, llm_int8, w8a8, w8a8_int8  # noqa: E402
from lamina.quant.config import WeightQuantArgs  # noqa: E402
from lamina.quant.packing import pack_int32  # noqa: E402
from lamina.quant.rtn import rtn_quantize  # noqa: E402
from lamina.quant.rtn4 import DEFAULT_GROUP_SIZE  # noqa: E402

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (96, 40)]  # (K, N); the last one is not a multiple of 8
ROWS = [1, 8, 16, 17, 33, 256, 2048]
PROMPTS = ["def fibonacci(n):", "class Stack:", "import os\n\n\ndef list_python_files(root):", "def is_prime(n):",
           "for line in open(path):", "def merge_sort(items):", "with open('data.csv') as f:", "async def fetch(url):"]


@contextlib.contextmanager
def reference_path():
    """Every W8A8 method on the reference GEMMs (the script patches them in; nothing else does)."""
    saved = (w8a8_int8.int8_matmul, llm_int8.int8_matmul, fp8.fp8_matmul)
    w8a8_int8.int8_matmul = llm_int8.int8_matmul = w8a8.int8_reference
    fp8.fp8_matmul = w8a8.fp8_reference
    try:
        yield
    finally:
        w8a8_int8.int8_matmul, llm_int8.int8_matmul, fp8.fp8_matmul = saved


def _time(fn, device: torch.device, reps: int = 20) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def _fp8_kernel_name(x_q: torch.Tensor, w_q: torch.Tensor) -> str | None:
    """The config of lamina's fp8 GEMM that fp8_matmul takes for these operands; None: torch._scaled_mm."""
    routed = dispatch.fp8_gemm_for(x_q, w_q)
    return None if routed is None else routed[1].name


def gemms(device: torch.device) -> list[dict]:
    rows_out = []
    gen = torch.Generator(device).manual_seed(0)
    for k, n in SHAPES:
        w = torch.randn(n, k, device=device, generator=gen) * 0.02
        w_q, w_s = w8a8.per_token_int8(w)
        w_f, w_fs = w8a8.per_token_fp8(w)
        for m in ROWS:
            x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
            x_q, _ = w8a8.per_token_int8(x)
            exact = torch.equal(w8a8.int8_matmul(x_q, w_q), w8a8.int8_reference(x_q, w_q))
            x_f, x_fs = w8a8.per_token_fp8(x)
            fast = w8a8.fp8_matmul(x_f, x_fs, w_f, w_fs, torch.bfloat16).float()
            ref = w8a8.fp8_reference(x_f, x_fs, w_f, w_fs, torch.float32)
            row = {"K": k, "N": n, "M": m, "int8_exact": exact,
                   "fp8_fast_path": w8a8.scaled_mm_supported(x_f, w_f),
                   "fp8_kernel": _fp8_kernel_name(x_f, w_f),
                   "fp8_rel_err": float((fast - ref).norm() / ref.norm())}
            if (k, n) == (4096, 4096) and m in (1, 16, 256, 2048):
                row["ms_bf16"] = _time(lambda: F.linear(x, w.to(torch.bfloat16)), device)
                row["ms_int8"] = _time(lambda: w8a8.int8_matmul(w8a8.per_token_int8(x)[0], w_q), device)
                row["ms_fp8"] = _time(lambda: w8a8.fp8_matmul(*w8a8.per_token_fp8(x), w_f, w_fs, torch.bfloat16),
                                      device)
            rows_out.append(row)
    return rows_out


def _layer(kind: str, k: int, n: int, device: torch.device) -> ReplicatedLinear:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1)) * 0.02
    if kind.startswith("fp8"):  # "fp8-static": one input scale for every token, as llm-compressor's FP8 scheme
        method = fp8.Fp8LinearMethod(fp8.weight_args(0), static_input=kind == "fp8-static")
        q = fp8.fp8_quantize(w, method.args, torch.float32)
    else:
        args = WeightQuantArgs(num_bits=8, symmetric=True, strategy="channel",
                               layout="int-quantized" if kind == "w8a8" else "pack-quantized")
        method = w8a8_int8.W8A8Int8LinearMethod(args) if kind == "w8a8" else llm_int8.LLMInt8LinearMethod(args)
        q = rtn_quantize(w, args, torch.bfloat16)
    torch.set_default_dtype(torch.bfloat16)
    try:
        layer = ReplicatedLinear(k, n, bias=True, quant_method=method)
    finally:
        torch.set_default_dtype(torch.float32)
    if kind == "llm_int8":
        layer.weight_packed.data.copy_(pack_int32(q.q, 8, dim=1))
    else:
        layer.weight.data.copy_(q.q)
    layer.weight_scale.data.copy_(q.scale)
    layer.bias.data.copy_(torch.linspace(-1, 1, n))
    if kind == "fp8-static":
        layer.input_scale.data.fill_(20.0 / fp8.FP8_MAX)  # the outlier columns' 20 maps to 448
    layer = layer.to(device)
    method.process_after_loading(layer)
    return layer


def layers(device: torch.device) -> list[dict]:
    out = []
    for kind in ("w8a8", "llm_int8", "fp8", "fp8-static"):
        for (k, n), m in ((4096, 4096), 7), ((4096, 14336), 300), ((96, 40), 5):
            layer = _layer(kind, k, n, device)
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            x[::4, :3] = 20.0  # outlier columns (LLM.int8() takes them in bf16)
            with torch.no_grad():
                fast = layer(x).float()
                with reference_path():
                    ref = layer(x).float()
            out.append({"method": kind, "K": k, "N": n, "M": m, "rel_err": float((fast - ref).norm() / ref.norm()),
                        "max_abs": float((fast - ref).abs().max())})
    return out


def _greedy(model: str, device: str) -> list[list[int]]:
    llm = LLM(model=model, device=device, dtype="bfloat16", gpu_memory_utilization=0.3)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    llm.engine.check_integrity()
    del llm
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return tokens


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    same = sum(x == y for u, v in zip(a, b) for x, y in zip(u, v))
    return same / sum(len(u) for u in a)


def _quantize(method: str, out: str) -> None:
    from lamina.quant.recipe import get_recipe
    from lamina.quantize.calibration import DEFAULT_CALIB_TEXT, calibration_sequences, read_calib_texts
    from lamina.quantize.methods import CALIBRATED, quantize_calibrated
    from lamina.quantize.writer import quantize_checkpoint
    from lamina.loader.tokenizer import Tokenizer

    if method in CALIBRATED:
        sequences = calibration_sequences(read_calib_texts(DEFAULT_CALIB_TEXT), Tokenizer.from_pretrained(DEMO_MODEL),
                                          16, 512)
        quantize_calibrated(DEMO_MODEL, out, CALIBRATED[method], 0, ("lm_head",), sequences, progress=False)
    else:
        recipe = get_recipe(method)  # the CLI's default group size where the recipe takes one
        quantize_checkpoint(DEMO_MODEL, out, recipe, DEFAULT_GROUP_SIZE if recipe.uses_group_size else 0,
                            ("lm_head",), progress=False)


def models(device: str) -> list[dict]:
    base = _greedy(DEMO_MODEL, device)
    out = []
    with tempfile.TemporaryDirectory() as work:
        for method in ("llm_int8", "w8a8", "smoothquant", "fp8"):
            path = str(Path(work) / method)
            _quantize(method, path)
            fast = _greedy(path, device)
            with reference_path():
                ref = _greedy(path, device)
            out.append({"method": method, "fast_vs_reference": _agreement(fast, ref),
                        "fast_vs_bf16": _agreement(fast, base), "reference_vs_bf16": _agreement(ref, base),
                        "identical_outputs": sum(a == b for a, b in zip(fast, ref))})
    return out


def _table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--result-file")
    args = parser.parse_args()
    device = torch.device(args.device)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__}
    for name, part in (("gemms", gemms), ("layers", layers)):
        report[name] = part(device)
        print(f"\n== {name}\n{_table(report[name])}")
    if not args.skip_models:
        report["models"] = models(args.device)
        print(f"\n== models (greedy, 8 prompts x 64 tokens, bf16)\n{_table(report['models'])}")
    failures = [f"int8 not exact at {r}" for r in report["gemms"] if not r["int8_exact"]]
    failures += [f"fp8 off at {r}" for r in report["gemms"] if r["fp8_rel_err"] > 1e-2]
    failures += [f"layer off at {r}" for r in report["layers"] if r["rel_err"] > 2e-2]
    report["failures"] = failures
    target = args.result_file or (os.path.join(os.environ["OUT"], "quant_w8a8_gpu_check.json")
                                  if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + ("OK" if not failures else "FAILED:\n  " + "\n  ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

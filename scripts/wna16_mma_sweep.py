"""W4A16 / W8A16 on Llama-3-8B shapes: the tensor-core kernel (lamina.kernels.wna16_mma) against the GEMV, the
dequantize pass + cuBLAS and cuBLAS on bf16, at 1 .. 2048 rows of x (issue #13).

    python scripts/wna16_mma_sweep.py [--quick]        # needs CUDA and triton; JSON to $OUT (default ./out)
    python scripts/wna16_mma_sweep.py --tiny           # any machine: the interpreter on a tiny shape (times: none)

int4: g128 asymmetric (rtn4's scheme); int8: per channel, symmetric (the int8 recipe's). Timed as
lamina.bench.quant_speed times (a CUDA graph of calls rotating weight copies through > 256 MB, do_bench
median); every kernel output is checked against the reference path first. Each mma config is tried at 1 and 16
rows (16 .. 2048 for the large-tile configs); the default config at every row count.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lamina.bench.quant_speed import QUANT, ROTATE_BYTES, SHAPES, _close, quant_copy, reference

if "--tiny" in sys.argv:
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 (+ interpreter fixes) before triton

from lamina.kernels.wna16_gemm import dequantize_weight, wna16_matmul  # noqa: E402
from lamina.kernels.wna16_gemv import MAX_M, wna16_gemv  # noqa: E402
from lamina.kernels.wna16_mma import WNA16MmaConfig, default_config, wna16_mma  # noqa: E402

SMALL_ROWS = (1, 2, 4, 8, 16)
LARGE_ROWS = (256, 2048)
SMALL = [WNA16MmaConfig(*c) for c in [(16, 16, 128, 2, 3), (16, 16, 128, 4, 4), (32, 16, 128, 4, 3),
                                      (32, 16, 128, 4, 4), (32, 16, 64, 4, 4), (32, 16, 128, 2, 4),
                                      (64, 16, 128, 4, 3), (64, 16, 128, 8, 3), (64, 16, 64, 4, 4),
                                      (128, 16, 128, 8, 3), (128, 16, 64, 4, 3), (64, 16, 128, 4, 2),
                                      (64, 16, 128, 4, 3, 2), (64, 16, 128, 4, 3, 4), (64, 16, 128, 4, 3, 8),
                                      (32, 16, 128, 2, 4, 4), (64, 16, 64, 4, 4, 8)]]
LARGE = [WNA16MmaConfig(*c) for c in [(64, 64, 64, 4, 3), (128, 64, 64, 8, 3), (128, 128, 64, 8, 3),
                                      (128, 128, 128, 8, 3), (64, 128, 64, 4, 3), (128, 64, 128, 8, 2)]]


def _time(calls: list, args: argparse.Namespace) -> float:
    from lamina.bench.gemv_sweep import _time_per_call

    return _time_per_call(calls[:1] if args.tiny else calls, args.device, 5, args.rep_ms)


def shape_row(name: str, n: int, k: int, args: argparse.Namespace) -> dict[str, Any]:
    gen = torch.Generator(device=args.device).manual_seed(0)
    copies = 1 if args.tiny else max(2, math.ceil(ROTATE_BYTES / (n * k * 2)))
    weights = [(torch.randn(n, k, device=args.device, generator=gen) / math.sqrt(k)).to(torch.bfloat16)
               for _ in range(copies)]
    row: dict[str, Any] = dict(shape=name, n=n, k=k, rows={}, dequantize={})
    for qname, (bits, gs, sym) in QUANT.items():
        first = quant_copy(n, k, bits, gs, sym, args.device, gen)
        count = 1 if args.tiny else max(2, math.ceil(ROTATE_BYTES / first["bytes"]))
        ops = [first] + [quant_copy(n, k, bits, gs, sym, args.device, gen) for _ in range(count - 1)]
        row[f"{qname}_bytes"] = first["bytes"]

        def call(fn: Any, x: torch.Tensor, op: dict, **kw: Any) -> torch.Tensor:
            return fn(x, op["words"], op["scale"], op["zero"], None, op["bits"], op["group_size"], **kw)

        def timed(fn: Any, x: torch.Tensor, ref: torch.Tensor, **kw: Any) -> dict[str, Any]:
            try:
                ok = _close(call(fn, x, ops[0], **kw), ref)
                return dict(ok=ok, us=_time([lambda op=op: call(fn, x, op, **kw) for op in ops], args))
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: record it, keep sweeping
                return dict(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")

        for m in args.rows:
            x = torch.randn(m, k, device=args.device, generator=gen).to(torch.bfloat16)
            ref = reference(x, first, k)
            r = row["rows"].setdefault(m, {})
            if qname == "int4":
                r["cublas_us"] = _time([lambda w=w: F.linear(x, w) for w in weights], args)
            r[f"{qname}_default"] = default_config(m, n, k, gs).name
            r[f"{qname}_mma"] = timed(wna16_mma, x, ref)
            if m <= MAX_M:
                r[f"{qname}_gemv"] = timed(wna16_gemv, x, ref)
            if m >= 16:
                r[f"{qname}_dequant_cublas"] = timed(wna16_matmul, x, ref)
            configs = (SMALL if m in (1, 16) else []) + (LARGE if m >= 16 else [])
            if not args.quick:
                r[f"{qname}_configs"] = {c.name: timed(wna16_mma, x, ref, config=c) for c in configs}
        row["dequantize"][qname] = _time([lambda op=op: dequantize_weight(op["words"], op["scale"], op["zero"], k,
                                                                          op["bits"], op["group_size"])
                                          for op in ops[:4]], args)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'shape':<8} {'M':>5} | {'cuBLAS':>7} | {'int4 gemv':>9} {'mma':>7} {'best cfg':>22} {'dq+cuB':>7} | "
             f"{'int8 gemv':>9} {'mma':>7} {'best cfg':>22} {'dq+cuB':>7}"]

    def us(d: dict | None) -> str:
        return "-" if not d else (f"{d['us']:.1f}" if d.get("ok") else "BAD")

    for row in rows:
        for m, r in row["rows"].items():
            cells = []
            for q in QUANT:
                good = {c: v for c, v in r.get(f"{q}_configs", {}).items() if v.get("ok")}
                best = min(good, key=lambda c: good[c]["us"]) if good else None
                cells.append(f"{us(r.get(f'{q}_gemv')):>9} {us(r[f'{q}_mma']):>7} "
                             f"{(best or '-') + (' ' + us(good[best]) if best else ''):>22} "
                             f"{us(r.get(f'{q}_dequant_cublas')):>7}")
            lines.append(f"{row['shape']:<8} {m:>5} | {r['cublas_us']:>7.1f} | " + " | ".join(cells))
        lines.append(f"{row['shape']:<8} dequantize pass: " + ", ".join(f"{q} {t:.1f} us"
                                                                       for q, t in row["dequantize"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="default configs only")
    parser.add_argument("--tiny", action="store_true", help="CPU, the interpreter, one tiny shape")
    parser.add_argument("--rep-ms", type=int, default=20)
    args = parser.parse_args(argv)
    args.device, args.rows, shapes = "cuda", SMALL_ROWS + LARGE_ROWS, SHAPES
    if args.tiny:
        args.device, args.rows, shapes, args.quick = "cpu", (1, 16), [("tiny", 48, 256)], True
    out = Path(os.environ.get("OUT") or "out")
    out.mkdir(parents=True, exist_ok=True)
    start, rows = time.perf_counter(), []
    for name, n, k in shapes:
        rows.append(shape_row(name, n, k, args))
        device = "cpu (interpreter)" if args.tiny else torch.cuda.get_device_name()
        (out / "wna16_mma_sweep.json").write_text(json.dumps(dict(device=device,
                                                                  torch=torch.__version__, rows=rows), indent=1))
        print(f"{name}: done at {time.perf_counter() - start:.0f} s", flush=True)
    print(table(rows))
    return 0 if all(v.get("ok", True) for row in rows for r in row["rows"].values()
                    for key, v in r.items() if key.endswith(("_mma", "_gemv", "_cublas"))) else 1


if __name__ == "__main__":
    sys.exit(main())

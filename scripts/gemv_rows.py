"""Decode-sized matmuls of 1..4 rows on the Llama-3-8B shapes: lamina's GEMV against cuBLAS (F.linear).

    python scripts/gemv_rows.py        # needs CUDA and triton

A verify step of k = 3 drafts multiplies 4 rows per linear layer: a weight stream should cost what 1 row
costs. Times are triton.testing.do_bench medians of one call with the weight read from HBM (L2 flushed).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from lamina.kernels.gemv import gemv

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}


def main() -> None:
    torch.manual_seed(0)
    print("shape      N x K          rows  gemv us  cuBLAS us")
    for name, (n, k) in SHAPES.items():
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        for rows in (1, 2, 3, 4):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ours = do_bench(lambda: gemv(x, weight), warmup=5, rep=25) * 1000
            cublas = do_bench(lambda: F.linear(x, weight), warmup=5, rep=25) * 1000
            print(f"{name:8s} {n:6d} x {k:5d} {rows:5d} {ours:8.1f} {cublas:10.1f}")


if __name__ == "__main__":
    main()

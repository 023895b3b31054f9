"""Tile choices of the attention kernels, in plain Python (no triton): the warm-up plans its batches
from them on any machine, and the kernels read them when they launch."""
from __future__ import annotations

import torch

LONG_QUERY = 2048  # query length from which prefill_config picks the long-sequence tiles


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def prefill_config(head_dim: int, dtype: torch.dtype, max_query_len: int = LONG_QUERY) -> dict[str, int]:
    """Tile sizes for Hopper (228 KB SMEM/SM): the Q tile plus num_stages buffers of the K and V tiles.

    16-bit, D <= 128, long queries:  Q 128x128x2 = 32 KB + 2 x (K 32 KB + V 32 KB) = 160 KB
    16-bit, D <= 128, short queries: Q 128x128x2 = 32 KB + 4 x (K  8 KB + V  8 KB) =  96 KB
    16-bit, D  > 128: Q  64x256x2 = 32 KB + 2 x (K 16 KB + V 16 KB) =  96 KB   (8 warps: no spills)
    fp32 (FMA dots):  Q 64x128x4  = 32 KB + 2 x (K 16 KB + V 16 KB) =  96 KB   (D > 128: BLOCK_M 32)

    The 16-bit D <= 128 pair is the H200 sweep's best (W5, docs/BENCHMARKS.md): 128 x 128 tiles from
    2k-token queries up (+16-21% over 128 x 64), 128 x 32 with 4 stages below (+16% on 32 x 512).
    """
    block_d = max(16, next_power_of_2(head_dim))
    if dtype == torch.float32:
        return dict(BLOCK_M=64 if block_d <= 128 else 32, BLOCK_N=32, num_warps=4, num_stages=2)
    if block_d > 128:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)
    if max_query_len >= LONG_QUERY:
        return dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)
    return dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=4)

"""Per-token activation quantization for the W8A8 matmuls (lamina/quant/w8a8.py) in one kernel.

    x [M, K] (model dtype)  ->  q [M, K] int8 or fp8 e4m3,  s [M, 1] float32
    s_m = max(max_k |x_mk| / QMAX, MIN_SCALE)        QMAX 127 (int8) or 448 (fp8)
    q_mk = round_half_even(x_mk / s_m) clamped to [-128, 127]  (int8)
         = e4m3(clamp(x_mk / s_m, -448, 448))                  (fp8, the cast rounds to nearest even)

grid (M,): program m reads row m twice in tiles of BLOCK (the max, then the quotients; the second read
mostly hits L2), so any K fits. The torch path it replaces (`per_token_int8` / `per_token_fp8`) upcasts
the whole x to float32 and makes five more passes over it; it stays the reference the tests compare with.
Rounding half to even: adding and subtracting 1.5 * 2^23 rounds a float32 of magnitude < 2^22 to an integer
as the FPU rounds, i.e. half to even, as torch.round does. Importing this module imports triton.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23
_MAX_BLOCK = 4096


@triton.jit
def _per_token_quant_kernel(x_ptr, q_ptr, s_ptr, stride_x, stride_q, k, qmax, min_scale,
                            IS_INT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, k, BLOCK):
        x = tl.load(x_ptr + row * stride_x + start + cols, mask=start + cols < k, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0) / qmax, min_scale)
    tl.store(s_ptr + row, scale)
    for start in range(0, k, BLOCK):
        mask = start + cols < k
        y = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32) / scale
        if IS_INT:
            y = (y + _ROUND_MAGIC) - _ROUND_MAGIC
            y = tl.minimum(tl.maximum(y, -128.0), 127.0)
        else:
            y = tl.minimum(tl.maximum(y, -qmax), qmax)
        tl.store(q_ptr + row * stride_q + start + cols, y.to(q_ptr.dtype.element_ty), mask=mask)


def per_token_quant(x: torch.Tensor, out_dtype: torch.dtype, qmax: float,
                    min_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (last dim contiguous) -> (q [M, K] of out_dtype (int8 or float8_e4m3fn), s float32 [M, 1])."""
    rows, k = x.shape
    q = torch.empty((rows, k), dtype=out_dtype, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows == 0:
        return q, scale
    block = min(_MAX_BLOCK, triton.next_power_of_2(k))
    _per_token_quant_kernel[(rows,)](x, q, scale, x.stride(0), q.stride(0), k, qmax, min_scale,
                                     IS_INT=out_dtype == torch.int8, BLOCK=block, num_warps=4 if block <= 1024 else 8)
    return q, scale

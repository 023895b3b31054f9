"""W4A16 / W8A16 GEMM for prefill and large batches: out = x @ dequantize(q, scale, zero_point).T (+ bias).

Same operands as lamina.kernels.wna16_gemv (pack-quantized int32 words [N, KW], scale [N, groups] in x's dtype,
int8 zero points or None, `xor` for a naive int8 weight viewed as words), any number of rows M.

Grid: one program per [BLOCK_M, BLOCK_N] output tile, programs ordered in bands of GROUP_M tile rows (the
weight tiles of a band stay in L2 while its x tiles are reused). Each K step loads x [BLOCK_M, BLOCK_K] and the
words holding weight [BLOCK_K, BLOCK_N] (each word is read by the 32 / BITS lanes that need one of its values:
the load coalescer serves them together), unpacks u = (word >> shift) & mask, and dequantizes in registers

    w = ((u - OFFSET - z) * s).to(x.dtype)      the exact value and one rounding: the reference's bf16 weight

then tl.dot(x, w) accumulates in fp32 (tensor cores on the GPU). The scale (and zero point) of a tile is one
[BLOCK_N] vector when BLOCK_K divides the group size (SCALAR_GROUP; always for "channel"), else gathered per
element. Bias and one rounding in the epilogue. No host sync, no workspace: capturable in a CUDA graph.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lamina.kernels.wna16_gemv import CHANNEL_GROUP, check_inputs
from lamina.kernels.wna16_mma import in_k_order

DEQUANTIZE_BLOCK = (32, 256)  # (rows, values of K) per program of the dequantize pass


@dataclass(frozen=True)
class WNA16GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    @property
    def name(self) -> str:
        return f"m{self.block_m}-n{self.block_n}-k{self.block_k}-g{self.group_m}-w{self.num_warps}-p{self.num_stages}"


@functools.lru_cache(maxsize=None)
def default_config(m: int, n: int, k: int, group_size: int | None) -> WNA16GemmConfig:
    """BLOCK_M grows with the rows (16 .. 128), BLOCK_N 128 (64 below 64 rows: more programs while the
    weight stream dominates), BLOCK_K 64, or a smaller power of two (>= 16) dividing the group size."""
    block_m = min(128, max(16, triton.next_power_of_2(m)))
    block_n = 128 if m > 64 else 64
    block_k = 64
    if group_size is not None:
        while block_k > 16 and group_size % block_k:
            block_k //= 2
    num_warps = 8 if block_m * block_n >= 128 * 128 else 4
    return WNA16GemmConfig(block_m, block_n, block_k, 8, num_warps, 3)  # 3 x (16 + 32 KB) of SMEM at most


@triton.jit
def _wna16_gemm_kernel(x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, group_size,
                       stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
                       BITS: tl.constexpr, XOR: tl.constexpr, HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr,
                       SCALAR_GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    PACK: tl.constexpr = 32 // BITS
    OFFSET: tl.constexpr = 1 << (BITS - 1)
    MASK: tl.constexpr = (1 << BITS) - 1
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    band = pid // (GROUP_M * tiles_n)
    first_m = band * GROUP_M
    band_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % band_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // band_rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_c = tl.minimum(offs_n, N - 1).to(tl.int64)  # clamped: unmasked weight loads
    m_mask = offs_m < M
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_cols = w_ptr + n_c[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        words = tl.load(w_cols + (offs_k // PACK)[:, None], mask=k_mask[:, None], other=0)  # [BLOCK_K, BLOCK_N]
        if XOR != 0:
            words = words ^ XOR
        u = ((words >> ((offs_k % PACK) * BITS)[:, None]) & MASK).to(tl.float32)
        if SCALAR_GROUP:
            g = k0 // group_size
            s = tl.load(s_ptr + n_c * stride_sn + g).to(tl.float32)[None, :]
            if HAS_ZERO:
                z = tl.load(z_ptr + n_c * stride_zn + g).to(tl.float32)[None, :] + OFFSET
            else:
                z = OFFSET
        else:
            g = tl.where(k_mask, offs_k // group_size, 0)[:, None]
            s = tl.load(s_ptr + n_c[None, :] * stride_sn + g).to(tl.float32)
            if HAS_ZERO:
                z = tl.load(z_ptr + n_c[None, :] * stride_zn + g).to(tl.float32) + OFFSET
            else:
                z = OFFSET
        w = ((u - z) * s).to(x_ptr.dtype.element_ty)
        acc = tl.dot(x, w, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n_c).to(tl.float32)[None, :]
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & (offs_n < N)[None, :])


def wna16_gemm(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
               bias: torch.Tensor | None, num_bits: int, group_size: int | None, xor: int = 0,
               config: WNA16GemmConfig | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize(words, scale, zero_point).T (+ bias) -> [M, N] in x's dtype, any M >= 0.
    group_size None: strategy "channel" (scale [N, 1])."""
    check_inputs(x, words, scale, zero_point, bias, num_bits)
    (m, k), n = x.shape, words.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    cfg = config or default_config(m, n, k, group_size)
    assert cfg.block_k % (32 // num_bits) == 0 or (32 // num_bits) % cfg.block_k == 0
    gs = group_size or CHANNEL_GROUP
    z = scale if zero_point is None else zero_point  # never read without HAS_ZERO
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _wna16_gemm_kernel[grid](
        x, words, scale, z, out if bias is None else bias, out, m, n, k, gs,
        x.stride(0), words.stride(0), scale.stride(0), z.stride(0), out.stride(0),
        BITS=num_bits, XOR=xor, HAS_ZERO=zero_point is not None, HAS_BIAS=bias is not None,
        SCALAR_GROUP=gs % cfg.block_k == 0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


@triton.jit
def _field(words, SHIFT: tl.constexpr, BITS: tl.constexpr):
    return (words >> SHIFT) & ((1 << BITS) - 1)


@triton.jit
def _dequantize_kernel(w_ptr, s_ptr, z_ptr, out_ptr, N, K, KW, group_size, stride_wn, stride_sn, stride_zn,
                       BITS: tl.constexpr, XOR: tl.constexpr, HAS_ZERO: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """out[N, K] = (u - OFFSET - z) * s in out's dtype: one rounding, the reference path's weight. Each word is
    loaded once, its fields taken with constant shifts and joined into K order (wna16_mma.in_k_order), so the
    store is contiguous."""
    PACK: tl.constexpr = 32 // BITS
    OFFSET: tl.constexpr = 1 << (BITS - 1)
    BLOCK_KW: tl.constexpr = BLOCK_K // PACK
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kw = tl.program_id(1) * BLOCK_KW + tl.arange(0, BLOCK_KW)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    rows = offs_n.to(tl.int64)[:, None]
    n_mask = (offs_n < N)[:, None]
    words = tl.load(w_ptr + rows * stride_wn + offs_kw[None, :], mask=n_mask & (offs_kw < KW)[None, :], other=0)
    if XOR != 0:
        words = words ^ XOR
    if BITS == 4:
        u = in_k_order(tl.join(_field(words, 0, 4), _field(words, 16, 4)),
                        tl.join(_field(words, 4, 4), _field(words, 20, 4)),
                        tl.join(_field(words, 8, 4), _field(words, 24, 4)),
                        tl.join(_field(words, 12, 4), _field(words, 28, 4)), BLOCK_N, BLOCK_K)
    else:
        u = in_k_order(_field(words, 0, 8), _field(words, 8, 8), _field(words, 16, 8), _field(words, 24, 8),
                        BLOCK_N, BLOCK_K)
    mask = n_mask & (offs_k < K)[None, :]
    g = (offs_k // group_size)[None, :]
    s = tl.load(s_ptr + rows * stride_sn + g, mask=mask, other=0.0).to(tl.float32)
    if HAS_ZERO:
        z = tl.load(z_ptr + rows * stride_zn + g, mask=mask, other=0).to(tl.float32) + OFFSET
    else:
        z = OFFSET
    tl.store(out_ptr + rows * K + offs_k[None, :], ((u.to(tl.float32) - z) * s).to(out_ptr.dtype.element_ty),
             mask=mask)


def dequantize_weight(words: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, k: int,
                      num_bits: int, group_size: int | None, xor: int = 0) -> torch.Tensor:
    """The weight [N, k] in scale's dtype (lamina.quant.wna16.dequantize of the unpacked words)."""
    n = words.shape[0]
    out = torch.empty((n, k), dtype=scale.dtype, device=words.device)
    z = scale if zero_point is None else zero_point
    _dequantize_kernel[(triton.cdiv(n, DEQUANTIZE_BLOCK[0]), triton.cdiv(k, DEQUANTIZE_BLOCK[1]))](
        words, scale, z, out, n, k, words.shape[1], group_size or CHANNEL_GROUP, words.stride(0), scale.stride(0),
        z.stride(0), BITS=num_bits, XOR=xor, HAS_ZERO=zero_point is not None, BLOCK_N=DEQUANTIZE_BLOCK[0],
        BLOCK_K=DEQUANTIZE_BLOCK[1], num_warps=4)
    return out


def wna16_matmul(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
                 bias: torch.Tensor | None, num_bits: int, group_size: int | None, xor: int = 0) -> torch.Tensor:
    """More rows than the GEMVs take: dequantize the weight to a temporary in x's dtype (a Triton kernel, one
    write of N x K) and multiply with cuBLAS. `wna16_gemm` above does it in one kernel but was far slower than
    this at every M measured on the H200 (too few programs at small M, per-element word loads and conversions at
    large M; docs/quantization.md), so the engine does not call it until it is tuned."""
    check_inputs(x, words, scale, zero_point, bias, num_bits)
    weight = dequantize_weight(words, scale, zero_point, x.shape[1], num_bits, group_size, xor)
    return torch.nn.functional.linear(x, weight, bias)

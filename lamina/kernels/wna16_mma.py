"""W4A16 / W8A16 matmul on the tensor cores, the weight as the MMA's left operand: out = x @ dequantize(words).T.

Same operands as lamina.kernels.wna16_gemv (pack-quantized int32 words [N, KW], scale [N, groups] in x's dtype,
int8 zero points or None, `xor` for a naive int8 weight viewed as words), any number of rows M.

A program owns BLOCK_N weight rows and BLOCK_M rows of x and computes the transposed tile out.T [BLOCK_N, BLOCK_M]
= W [BLOCK_N, K] @ x.T [K, BLOCK_M] ("swap AB"): the weight fills the MMA's 16-row side, so one row of x costs
BLOCK_M = 16 columns of tensor-core work, which is free next to the weight stream. Each K step covers BLOCK_K
values of one quantization group and turns the words into 16-bit floats two at a time:

    ((word >> s) & 0x000F000F) | MAGIC          MAGIC = two copies of 128.0 (bf16 0x4300) or 1024.0 (fp16 0x6400)

is the pair (BASE + nibble at bit s, BASE + nibble at bit s + 16), exact, one shift and one LOP3 per two values;
the pairs are joined back into K order in registers (below). A 4-bit word is 8 nibbles; an 8-bit word is 4
bytes = a low and a high nibble plane, multiplied separately and added as low + 16 * high. The dot of x with
the biased values gives, per group,

    sum_k x[k] * u[k] + BIAS * sum_k x[k]          BIAS = BASE (4 bits) or 17 * BASE (8 bits)

so the step adds s * (dot - (BIAS + OFFSET + z) * sum_k x[k]) to the fp32 accumulator (u the stored field
q + OFFSET): the GEMV's per-group algebra (wna16_gemv's docstring), one rounding at the end.

Joining into K order: the half words of shift 4i hold values i and i + 4 of a 4-bit word. With join(a, b)
appending an axis [a, b], join(join(J[0], J[2]), join(J[1], J[3])) of J[i] = join(value i, value i + 4) is
[BLOCK_N, words, 2, 2, 2] whose flat index 4p + 2q + r is the value index j = i + 4p, i = 2q + r: a reshape gives
K order, so x is read as it lies. 8 bits, a plane: join(join(byte 0, byte 2), join(byte 1, byte 3)).

Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), SPLIT_K); rows past N are clamped for the loads and masked at the
store, K is masked only when BLOCK_K does not divide it. A K step takes ~0.6-0.8 us whatever BLOCK_N (H200: its
x tile, layout conversions and the dot's latency), so a weight of few row blocks (N = 4,096: 64 programs for
132 SMs) is split along K: split j walks its share of the steps and writes fp32 partial sums to a workspace
[SPLIT_K, M, N], which `_reduce_splits_kernel` adds up (with the bias) into the output. No host sync:
capturable in a CUDA graph.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lamina.kernels.wna16_gemv import CHANNEL_GROUP, INTERPRETER_SMS, check_inputs, num_sms

MAX_M = 16  # rows lamina.quant.wna16 sends here (more: dequantize + cuBLAS); the kernel itself takes any M


def takes(k: int, group_size: int | None) -> bool:
    """Whether the kernel takes a weight of K = k with this group size (None: per channel): both multiples of 16."""
    return k % 16 == 0 and (group_size is None or group_size % 16 == 0)


@dataclass(frozen=True)
class WNA16MmaConfig:
    block_n: int  # weight rows per program (>= 16: the MMA's row side)
    block_m: int  # rows of x per program (>= 16)
    block_k: int  # values of K per step, dividing the group size
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1  # programs along K, each over its share of the K steps

    @property
    def name(self) -> str:
        split = f"-s{self.split_k}" if self.split_k > 1 else ""
        return f"n{self.block_n}-m{self.block_m}-k{self.block_k}-w{self.num_warps}-p{self.num_stages}{split}"


PROGRAMS_PER_SM = 4  # split K until about this many programs per SM
REDUCE_BLOCK = 1024  # outputs per program of the split-K reduction
MIN_SPLIT_STEPS = 4  # K steps a split walks at least


@functools.lru_cache(maxsize=None)
def default_config(m: int, n: int, k: int, group_size: int | None, sms: int = INTERPRETER_SMS) -> WNA16MmaConfig:
    """Up to 16 rows: 64 weight rows x 16 rows of x per program, 4 warps, 3 stages (the fastest of the 12 unsplit
    configs summed over the Llama-3-8B shapes at 16 rows, int4 g128 and int8 per channel alike:
    scripts/wna16_mma_sweep.py on the H200); more rows: 128 x 64 (128 from 128 rows), 8 warps. BLOCK_K 128, or
    the largest power of two (>= 16) dividing the group size and K. K split until PROGRAMS_PER_SM programs per
    SM, each split at least MIN_SPLIT_STEPS steps."""
    block_k = 128
    while block_k > 16 and ((group_size is not None and group_size % block_k) or k % block_k):
        block_k //= 2
    if m <= 16:
        block_n, block_m, warps = 64, 16, 4
    else:
        block_n, block_m, warps = 128, 64 if m <= 64 else 128, 8
    programs = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = max(1, min(PROGRAMS_PER_SM * sms // programs, triton.cdiv(k, block_k) // MIN_SPLIT_STEPS))
    return WNA16MmaConfig(block_n, block_m, block_k, warps, 3, split)


@triton.jit
def _pairs(w, SHIFT: tl.constexpr, MAGIC: tl.constexpr, DTYPE: tl.constexpr):
    """(BASE + the nibble at bit SHIFT, BASE + the nibble at bit SHIFT + 16) of each word, as DTYPE: exact."""
    t = ((w >> SHIFT) & 0x000F000F) | MAGIC
    low = (t & 0xFFFF).to(tl.int16).to(DTYPE, bitcast=True)
    high = (t >> 16).to(tl.int16).to(DTYPE, bitcast=True)
    return low, high


@triton.jit
def in_k_order(a, b, c, d, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K] from four [BLOCK_N, words] tensors holding value i of each group of four (a: 0 ... d: 3)
    when each word holds four values (or, joined first, eight: the module docstring)."""
    return tl.reshape(tl.join(tl.join(a, c), tl.join(b, d)), (BLOCK_N, BLOCK_K))


@triton.jit
def _wna16_mma_kernel(x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, group_size,
                      stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
                      BITS: tl.constexpr, XOR: tl.constexpr, HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr,
                      IS_BF16: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    PACK: tl.constexpr = 32 // BITS
    OFFSET: tl.constexpr = 1 << (BITS - 1)
    BLOCK_KW: tl.constexpr = BLOCK_K // PACK
    DTYPE: tl.constexpr = tl.bfloat16 if IS_BF16 else tl.float16
    MAGIC: tl.constexpr = 0x43004300 if IS_BF16 else 0x64006400
    BASE: tl.constexpr = 128.0 if IS_BF16 else 1024.0
    BIAS: tl.constexpr = BASE if BITS == 4 else 17.0 * BASE
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_c = tl.minimum(rows, N - 1).to(tl.int64)  # clamped: unmasked loads
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    x_cols = x_ptr + offs_m.to(tl.int64)[None, :] * stride_xm
    w_rows = w_ptr + rows_c[:, None] * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    split_len = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = tl.program_id(2) * split_len
    for k0 in range(k_start, tl.minimum(K, k_start + split_len), BLOCK_K):
        offs_kw = k0 // PACK + tl.arange(0, BLOCK_KW)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            w = tl.load(w_rows + offs_kw[None, :], eviction_policy="evict_first")
            xt = tl.load(x_cols + offs_k[:, None], mask=m_mask[None, :], other=0.0)
        else:
            w = tl.load(w_rows + offs_kw[None, :], mask=(offs_kw * PACK < K)[None, :], other=0,
                        eviction_policy="evict_first")
            xt = tl.load(x_cols + offs_k[:, None], mask=m_mask[None, :] & (offs_k < K)[:, None], other=0.0)
        if XOR != 0:
            w = w ^ XOR
        a0, b0 = _pairs(w, 0, MAGIC, DTYPE)
        a1, b1 = _pairs(w, 4, MAGIC, DTYPE)
        a2, b2 = _pairs(w, 8, MAGIC, DTYPE)
        a3, b3 = _pairs(w, 12, MAGIC, DTYPE)
        if BITS == 4:
            wq = in_k_order(tl.join(a0, b0), tl.join(a1, b1), tl.join(a2, b2), tl.join(a3, b3), BLOCK_N, BLOCK_K)
            d = tl.dot(wq, xt)
        else:  # low nibbles of bytes 0..3: a0, a2, b0, b2; high nibbles: a1, a3, b1, b3
            low = in_k_order(a0, a2, b0, b2, BLOCK_N, BLOCK_K)
            high = in_k_order(a1, a3, b1, b3, BLOCK_N, BLOCK_K)
            d = tl.dot(low, xt) + 16.0 * tl.dot(high, xt)
        xsum = tl.sum(xt.to(tl.float32), axis=0)  # [BLOCK_M]
        g = k0 // group_size
        s = tl.load(s_ptr + rows_c * stride_sn + g).to(tl.float32)
        if HAS_ZERO:
            z = tl.load(z_ptr + rows_c * stride_zn + g).to(tl.float32) + (BIAS + OFFSET)
        else:
            z = tl.full([BLOCK_N], BIAS + OFFSET, dtype=tl.float32)
        acc += s[:, None] * (d - z[:, None] * xsum[None, :])
    mask = m_mask[None, :] & (rows < N)[:, None]
    if SPLIT_K > 1:  # partial sums: out_ptr is the fp32 workspace [SPLIT_K, M, N]
        part = out_ptr + (tl.program_id(2) * M + offs_m.to(tl.int64))[None, :] * N + rows[:, None]
        tl.store(part, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows_c).to(tl.float32)[:, None]
        out = out_ptr + offs_m.to(tl.int64)[None, :] * stride_om + rows[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _reduce_splits_kernel(ws_ptr, b_ptr, out_ptr, M, N, stride_om, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                          BLOCK: tl.constexpr):
    """out[m, n] = sum_j ws[j, m, n] (+ bias[n]) in out's dtype: one rounding."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(SPLIT_K):
        acc += tl.load(ws_ptr + j * M * N + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + (offs // N) * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=mask)


def wna16_mma(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
              bias: torch.Tensor | None, num_bits: int, group_size: int | None, xor: int = 0,
              config: WNA16MmaConfig | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize(words, scale, zero_point).T (+ bias) -> [M, N] in x's dtype, any M >= 0.
    group_size None: strategy "channel" (scale [N, 1]). K and the group size must be multiples of 16 (`takes`)."""
    check_inputs(x, words, scale, zero_point, bias, num_bits)
    (m, k), n = x.shape, words.shape[0]
    assert takes(k, group_size), f"wna16_mma takes K and the group size in multiples of 16, got {k}, {group_size}"
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    cfg = config or default_config(m, n, k, group_size, num_sms(x.device))
    gs = group_size or CHANNEL_GROUP
    assert gs % cfg.block_k == 0 and cfg.block_k % 16 == 0, f"block_k {cfg.block_k} must divide group {gs}"
    z = scale if zero_point is None else zero_point  # never read without HAS_ZERO
    b = out if bias is None else bias  # never read without HAS_BIAS
    dest = out if cfg.split_k == 1 else torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), cfg.split_k)
    _wna16_mma_kernel[grid](
        x, words, scale, z, b, dest, m, n, k, gs,
        x.stride(0), words.stride(0), scale.stride(0), z.stride(0), out.stride(0),
        BITS=num_bits, XOR=xor, HAS_ZERO=zero_point is not None, HAS_BIAS=bias is not None,
        IS_BF16=x.dtype == torch.bfloat16, EVEN_K=k % cfg.block_k == 0, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m,
        BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.split_k > 1:
        _reduce_splits_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            dest, b, out, m, n, out.stride(0), SPLIT_K=cfg.split_k, HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK)
    return out

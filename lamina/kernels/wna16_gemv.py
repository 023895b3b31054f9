"""W4A16 / W8A16 GEMV for decode-sized batches: out = x @ dequantize(q, scale, zero_point).T (+ bias), M <= 4.

    x            [M, K]            fp16 / bf16, rows may be strided, last stride 1
    words        int32 [N, KW]     the checkpoint's pack-quantized words (lamina/quant/packing.py): 32 / BITS
                                   values per word along K, value j in bits [j * BITS, (j + 1) * BITS), stored
                                   unsigned (q + 2^(BITS-1)); or a naive int8 weight [N, K] viewed as int32
                                   (`xor=NAIVE_INT8_XOR` turns its two's-complement bytes into that offset form)
    scale        [N, groups]       x's dtype;  zero_point int8 [N, groups] or None (symmetric)
    out          [M, N]            x's dtype; fp32 inside, one rounding at the end

w = (q - z) * s with q = u - OFFSET (u the stored field) is computed per group, never per weight:

    sum_k w[n, k] x[k] = sum_groups s[n, g] * (sum_{k in g} u[n, k] x[k] - (z[n, g] + OFFSET) * sum_{k in g} x[k])

so each weight word is read once, for every row of x, and turned into floats in registers with one AND-OR
and one FADD per value (no int-to-float conversion, no shift): the field at bits [p, p + BITS) of a 16-bit half
word, OR-ed into the mantissa of 2^23, is the float 2^23 + u * 2^p; minus 2^23 it is u * 2^p exactly, and x is
pre-scaled by 2^-p (exact) once per tile for all BLOCK_N output rows. The high half word is one shift per word.
Each (row, group) scale and zero point is loaded once per program. 2^23's bits are a kernel argument, so that
they sit in a register and AND-OR is one LOP3 (with two immediates ptxas emits two). x's tile is loaded as
[GROUPS, GROUP_W, PACK] (16-byte loads) and split into its PACK columns in registers. A 4-D unpack ([.., PACK]
against x as loaded) compiled to shared-memory layout conversions and ~2x the instructions: not kept.

Grid (cdiv(N, BLOCK_N),): a program owns BLOCK_N output rows and walks K in tiles of BLOCK_KW words, a tile
being GROUPS sub-groups of GROUP_W <= 4 words (one thread's 16-byte load), each inside one quantization group.
A sub-group's sums stay in its thread and add into fp32 accumulators [BLOCK_N, GROUPS] kept over the K loop;
they are reduced across threads once, at the end (per-tile reductions cost more instructions than the
dequantization: SASS of sm_90, compiled ahead of time). Rows past N are clamped for the loads, masked at
the store; K is masked only when the tile does not divide it (EVEN_K). No host sync, no workspace: capturable
in a CUDA graph. Importing this module imports triton (lamina.quant.wna16.kernel_for imports it lazily).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_M = 4
NAIVE_INT8_XOR = -0x7F7F7F80  # 0x80808080 as int32: flips each byte's sign bit, two's complement -> q + 128
_MAGIC = 0x4B000000  # the bits of float32 2^23
CHANNEL_GROUP = 1 << 30  # the group size passed for strategy "channel": every K index is in group 0
INTERPRETER_SMS = 132
PROGRAMS_PER_SM = 4
WORDS_PER_THREAD = {4: (16, 16, 8, 8), 8: (32, 16, 8, 8)}  # by bits, then rows of x (1..4)


@dataclass(frozen=True)
class WNA16GemvConfig:
    block_n: int  # output rows per program (power of two)
    block_kw: int  # int32 words of K per tile (power of two)
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self) -> None:
        for name in ("block_n", "block_kw", "num_warps"):
            value = getattr(self, name)
            assert value >= 1 and value & (value - 1) == 0, f"{name} must be a power of two, got {value}"

    @property
    def name(self) -> str:
        return f"n{self.block_n}-kw{self.block_kw}-w{self.num_warps}-p{self.num_stages}"


CANDIDATE_CONFIGS = [WNA16GemvConfig(1, 512, 4), WNA16GemvConfig(2, 512, 4), WNA16GemvConfig(4, 512, 4),
                     WNA16GemvConfig(4, 256, 2), WNA16GemvConfig(8, 128, 2), WNA16GemvConfig(8, 256, 4),
                     WNA16GemvConfig(4, 128, 1), WNA16GemvConfig(2, 256, 2), WNA16GemvConfig(4, 512, 8),
                     WNA16GemvConfig(4, 256, 2, 2)]


@functools.cache
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def default_config(n: int, k: int, num_bits: int, sms: int = INTERPRETER_SMS, m: int = 1) -> WNA16GemvConfig:
    """4 warps, each thread WORDS_PER_THREAD[(bits, m)] words per tile: a tile of the largest power of two
    <= 512 words (1024 at 8 bits) dividing the row, as many rows as fill it, halved while fewer than
    PROGRAMS_PER_SM programs per SM. Chosen on sm_90 SASS compiled ahead of time (no GPU at hand): fixed
    per-tile work (x's tile, its layout conversion, scales) is spread over more weight words per thread until
    registers spill (M = 4 spills at 16 words); lamina/bench/quant_speed.py times CANDIDATE_CONFIGS."""
    per_word = 32 // num_bits
    kw = triton.cdiv(k, per_word)
    block_kw = min(triton.next_power_of_2(kw), 4096 // per_word)
    while block_kw > 16 and kw % block_kw:
        block_kw //= 2
    per_thread = WORDS_PER_THREAD[num_bits][min(m, MAX_M) - 1]
    block_n = max(1, per_thread * 32 * 4 // block_kw)
    while block_n > 1 and triton.cdiv(n, block_n) < PROGRAMS_PER_SM * sms:
        block_n //= 2
    return WNA16GemvConfig(block_n, block_kw, max(1, min(8, block_n * block_kw // (32 * per_thread))))


def group_words(num_bits: int, group_size: int | None, block_kw: int, sub_words: int = 4) -> int:
    """Words per sub-group of a tile: sub_words (one thread's 16-byte load: its sums stay in the thread), fewer
    when a group's words are not a multiple of them (the largest power of two dividing them), at most block_kw.
    ValueError if a group is not whole words."""
    if group_size is None:
        return min(block_kw, sub_words)
    per_word = 32 // num_bits
    if group_size % per_word:
        raise ValueError(f"group_size {group_size} is not a multiple of {per_word} {num_bits}-bit values per word")
    words = group_size // per_word
    return min(block_kw, sub_words, words & -words)


@triton.jit
def _field(src, magic, SHIFT: tl.constexpr, BITS: tl.constexpr):
    """u * 2^SHIFT as float32, u the BITS-bit field of src at bit SHIFT (SHIFT + BITS <= 16): exact.
    magic = 0x4B000000 (2^23), a runtime value: one LOP3 (src & MASK) | magic."""
    MASK: tl.constexpr = ((1 << BITS) - 1) << SHIFT
    return ((src & MASK) | magic).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _row(acc, x_row_ptr, words_idx, K, s, z, v0, v1, v2, v3, v4, v5, v6, v7, BITS: tl.constexpr,
         EVEN_K: tl.constexpr, GROUPS: tl.constexpr, GROUP_W: tl.constexpr):
    """acc[BLOCK_N, GROUPS] + s * (sum u x - z * sum x) per sub-group, for one row of x; v_j = u_j * 2^shift_j."""
    PACK: tl.constexpr = 32 // BITS
    offs = words_idx[:, :, None] * PACK + tl.arange(0, PACK)[None, None, :]  # [GROUPS, GROUP_W, PACK]
    if EVEN_K:
        x = tl.load(x_row_ptr + offs).to(tl.float32)
    else:
        x = tl.load(x_row_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
    xsum = tl.sum(tl.sum(x, axis=2), axis=1)  # [GROUPS]
    if BITS == 4:  # value j of a word: x[..., j]; split the 8 apart (even / odd, recursively)
        e, o = tl.split(tl.reshape(x, (GROUPS, GROUP_W, 4, 2)))
        ee, eo = tl.split(tl.reshape(e, (GROUPS, GROUP_W, 2, 2)))
        oe, oo = tl.split(tl.reshape(o, (GROUPS, GROUP_W, 2, 2)))
        x0, x4 = tl.split(ee)
        x2, x6 = tl.split(eo)
        x1, x5 = tl.split(oe)
        x3, x7 = tl.split(oo)
        part = (v0 * x0[None] + v1 * (x1 * 0.0625)[None] + v2 * (x2 * 0.00390625)[None]
                + v3 * (x3 * 0.000244140625)[None] + v4 * x4[None] + v5 * (x5 * 0.0625)[None]
                + v6 * (x6 * 0.00390625)[None] + v7 * (x7 * 0.000244140625)[None])
    else:
        e, o = tl.split(tl.reshape(x, (GROUPS, GROUP_W, 2, 2)))
        x0, x2 = tl.split(e)
        x1, x3 = tl.split(o)
        part = v0 * x0[None] + v1 * (x1 * 0.00390625)[None] + v2 * x2[None] + v3 * (x3 * 0.00390625)[None]
    return acc + s * (tl.sum(part, axis=2) - z * xsum[None, :])


@triton.jit
def _store_row(acc, m: tl.constexpr, rows, row_mask, b_ptr, out_ptr, stride_om, HAS_BIAS: tl.constexpr):
    acc = tl.sum(acc, axis=1)  # the one cross-thread reduction: per-sub-group sums, kept over the K loop
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + rows, acc.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _wna16_gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, N, K, KW, group_size, magic,
                       stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
                       M: tl.constexpr, BITS: tl.constexpr, XOR: tl.constexpr, HAS_ZERO: tl.constexpr,
                       HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
                       GROUPS: tl.constexpr, GROUP_W: tl.constexpr):
    PACK: tl.constexpr = 32 // BITS
    OFFSET: tl.constexpr = 1 << (BITS - 1)
    BLOCK_KW: tl.constexpr = GROUPS * GROUP_W
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    rows_c = tl.minimum(rows, N - 1).to(tl.int64)  # clamped: unmasked loads
    offs_g = tl.arange(0, GROUPS)
    tile = offs_g[:, None] * GROUP_W + tl.arange(0, GROUP_W)[None, :]  # [GROUPS, GROUP_W] word offsets
    w_rows = w_ptr + rows_c[:, None, None] * stride_wn
    acc0 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    for kw0 in range(0, KW, BLOCK_KW):
        words_idx = kw0 + tile
        if EVEN_K:
            w = tl.load(w_rows + words_idx[None], eviction_policy="evict_first")
        else:
            w = tl.load(w_rows + words_idx[None], mask=(words_idx < KW)[None], other=0, eviction_policy="evict_first")
        if XOR != 0:
            w = w ^ XOR
        hi = w >> 16
        if BITS == 4:
            v0, v1, v2, v3 = _field(w, magic, 0, 4), _field(w, magic, 4, 4), _field(w, magic, 8, 4), \
                _field(w, magic, 12, 4)
            v4, v5, v6, v7 = _field(hi, magic, 0, 4), _field(hi, magic, 4, 4), _field(hi, magic, 8, 4), \
                _field(hi, magic, 12, 4)
        else:
            v0, v1, v2, v3 = _field(w, magic, 0, 8), _field(w, magic, 8, 8), _field(hi, magic, 0, 8), \
                _field(hi, magic, 8, 8)
            v4, v5, v6, v7 = v0, v0, v0, v0  # unused at 8 bits
        group_start = kw0 + offs_g * GROUP_W
        g_mask = (group_start < KW)[None, :]
        g_idx = (group_start * PACK // group_size)[None, :]
        s = tl.load(s_ptr + rows_c[:, None] * stride_sn + g_idx, mask=g_mask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            z = tl.load(z_ptr + rows_c[:, None] * stride_zn + g_idx, mask=g_mask, other=0).to(tl.float32) + OFFSET
        else:
            z = tl.full([BLOCK_N, GROUPS], OFFSET, dtype=tl.float32)
        acc0 = _row(acc0, x_ptr, words_idx, K, s, z, v0, v1, v2, v3, v4, v5, v6, v7, BITS, EVEN_K, GROUPS, GROUP_W)
        if M > 1:
            acc1 = _row(acc1, x_ptr + stride_xm, words_idx, K, s, z, v0, v1, v2, v3, v4, v5, v6, v7,
                        BITS, EVEN_K, GROUPS, GROUP_W)
        if M > 2:
            acc2 = _row(acc2, x_ptr + 2 * stride_xm, words_idx, K, s, z, v0, v1, v2, v3, v4, v5, v6, v7,
                        BITS, EVEN_K, GROUPS, GROUP_W)
        if M > 3:
            acc3 = _row(acc3, x_ptr + 3 * stride_xm, words_idx, K, s, z, v0, v1, v2, v3, v4, v5, v6, v7,
                        BITS, EVEN_K, GROUPS, GROUP_W)
    _store_row(acc0, 0, rows, row_mask, b_ptr, out_ptr, stride_om, HAS_BIAS)
    if M > 1:
        _store_row(acc1, 1, rows, row_mask, b_ptr, out_ptr, stride_om, HAS_BIAS)
    if M > 2:
        _store_row(acc2, 2, rows, row_mask, b_ptr, out_ptr, stride_om, HAS_BIAS)
    if M > 3:
        _store_row(acc3, 3, rows, row_mask, b_ptr, out_ptr, stride_om, HAS_BIAS)


def check_inputs(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
                 bias: torch.Tensor | None, num_bits: int) -> None:
    """Shared by the GEMV and the GEMM (lamina.kernels.wna16_gemm)."""
    assert num_bits in (4, 8), f"num_bits must be 4 or 8, got {num_bits}"
    assert x.dim() == 2 and words.dim() == 2, "x must be [M, K] and words [N, KW]"
    assert x.dtype in (torch.float16, torch.bfloat16), f"x must be fp16 or bf16, got {x.dtype}"
    assert words.dtype == torch.int32 and words.is_contiguous(), "words must be contiguous int32 [N, KW]"
    assert words.shape[1] == triton.cdiv(x.shape[1], 32 // num_bits), \
        f"K mismatch: x {tuple(x.shape)}, words {tuple(words.shape)} at {num_bits} bits"
    assert x.stride(1) == 1 or x.shape[1] == 1, "x's last dim must be contiguous (stride 1)"
    assert scale.dtype == x.dtype and scale.shape[0] == words.shape[0], "scale must be [N, groups] in x's dtype"
    assert zero_point is None or (zero_point.dtype == torch.int8 and zero_point.shape == scale.shape), \
        "zero_point must be int8 [N, groups]"
    assert bias is None or (bias.shape == (words.shape[0],) and bias.dtype == x.dtype), "bias must be [N], x's dtype"


def wna16_gemv(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
               bias: torch.Tensor | None, num_bits: int, group_size: int | None, xor: int = 0,
               config: WNA16GemvConfig | None = None) -> torch.Tensor:
    """x [M, K] @ dequantize(words, scale, zero_point).T (+ bias) -> [M, N], 1 <= M <= MAX_M.
    group_size None: strategy "channel" (scale [N, 1])."""
    check_inputs(x, words, scale, zero_point, bias, num_bits)
    assert 1 <= x.shape[0] <= MAX_M, f"wna16_gemv takes 1..{MAX_M} rows, got {x.shape[0]}"
    (m, k), (n, kw) = x.shape, words.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    cfg = config or default_config(n, k, num_bits, num_sms(x.device), m)
    gw = group_words(num_bits, group_size, cfg.block_kw)
    z = scale if zero_point is None else zero_point  # never read without HAS_ZERO
    _wna16_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, words, scale, z, out if bias is None else bias, out, n, k, kw, group_size or CHANNEL_GROUP, _MAGIC,
        x.stride(0), words.stride(0), scale.stride(0), z.stride(0), out.stride(0),
        M=m, BITS=num_bits, XOR=xor, HAS_ZERO=zero_point is not None, HAS_BIAS=bias is not None,
        EVEN_K=k % (cfg.block_kw * 32 // num_bits) == 0, BLOCK_N=cfg.block_n, GROUPS=cfg.block_kw // gw,
        GROUP_W=gw, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out

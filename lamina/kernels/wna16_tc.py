"""W4A16 / W8A16 GEMV on the tensor cores for 1..MAX_M rows of bf16 x (decode): out = x @ dequantize(words, scale,
zero_point).T (+ bias), reading the checkpoint's words as stored (nothing repacked).

    x            [M, K]            bf16, last stride 1, K whole chunks (128 values at 4 bits, 64 at 8); int32 pairs
    words        int32 [N, KW]     pack-quantized: value j of a word in bits [j * BITS, (j + 1) * BITS), stored
                                   unsigned (u = q + 8 / q + 128); or a naive int8 weight viewed as int32 (`xor`)
    scale        bf16 [N, groups]  per channel, or groups of whole chunks;  zero_point int8 or None
    out          bf16 [M, N]       fp32 inside, one rounding at the end (after the bias)

lamina.kernels.wna16_row multiplies each weight value into each row of x with an FFMA, so its instructions grow
with the rows (int4: 30.6 a word at 1 row, 68.4 at 4). Here a word's values become bf16 pairs in registers (int4:
3 SHF and 4 LOP3 for 8 values; int8: a PRMT and an FADD a value, a PRMT a pair) that feed `mma.sync` directly
(lamina/kernels/wna16_frags.py has the fragment layout): the tensor core does the sums, for up to 8 rows of x at
the cost of one; rows 9..16 are a second block, the same A fragments into a second MMA chain (ptxas shares the
unpacking). lamina.quant.wna16 says where it runs (from 2 rows on at int4, 4 at int8, and the int4 LM head).

A program is one warp (lane 4 g + t) over TILES tiles of 16 weight rows; it walks K in steps of CHUNKS chunks of
16 words: lane (g, t) loads words 16 c + 4 t .. + 3 of rows g and g + 8 of each tile (16-byte loads), the next
step's before this one's MMAs (PREFETCH). Tensor dimensions stand for the lanes:

    words, sums   [8 g, TILES, CHUNKS, 16 = 4 t + j]      registers: TILES x CHUNKS x 4 a lane
    slot 4 t + j of a chunk's result:  weight row g (j < 2) or g + 8,  x's row 2t + j % 2

Per chunk: acc += scale * (D - zb * sum(x)), D the chained MMAs' sum of A value x x, the A values 128 + u (int4)
or q (int8), zb what they carry beyond q - z (136 + z at int4, z at int8; int8 without zero points skips it) and
sum(x) the same chain with A = 1 (`x_sums`, shared by the tiles). Only the weights are loaded with tl.load: x,
the scales, zero points, bias and partials go through inline assembly, whose results take the weights' layout
(a tl.load's own layout would pull the sums into it through a layout conversion every step). Split K and its
workspace as lamina.kernels.wna16_row's (one launch; the last program of a row block adds the partials in
order). Importing this module imports triton.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from lamina.kernels import pdl
from lamina.kernels.pdl import compiled
from lamina.kernels.wna16_frags import load_f32, mma_chain, store_f32, x_frags, x_sums
from lamina.kernels.wna16_gemv import CHANNEL_GROUP, INTERPRETER_SMS, check_inputs, num_sms
from lamina.kernels.wna16_row import split_count, workspace

MAX_M = 16  # rows of x: two blocks of the MMA's 8 columns
CHUNK_WORDS = 16  # words of a row a chunk covers: 4 lanes x 4 words, 128 values


def takes(x_dtype: torch.dtype, rows: int, k: int, num_bits: int, group_size: int | None) -> bool:
    """Whether wna16_tc_gemv takes these operands: bf16 x of 1..MAX_M rows, 4- or 8-bit weights, K a whole number
    of chunks (128 values at 4 bits, 64 at 8) and per-channel scales or groups of whole chunks."""
    if x_dtype != torch.bfloat16 or not 1 <= rows <= MAX_M or num_bits not in (4, 8):
        return False
    chunk = CHUNK_WORDS * 32 // num_bits
    return k > 0 and k % chunk == 0 and (group_size is None or group_size % chunk == 0)


@dataclass(frozen=True)
class WNA16TCConfig:
    tiles: int = 2  # 16-row tiles a program (power of two)
    chunks: int = 2  # 16-word chunks of each row a K step (power of two)
    split: int = 1  # programs along K (clamped to the steps; runtime argument: no recompile)
    prefetch: bool = True  # load the next K step's words before this step's MMAs

    def __post_init__(self) -> None:
        for name in ("tiles", "chunks"):
            value = getattr(self, name)
            assert value >= 1 and value & (value - 1) == 0, f"{name} must be a power of two, got {value}"
        assert self.split >= 1, f"bad config {self}"

    @property
    def name(self) -> str:
        return f"t{self.tiles}-c{self.chunks}-s{self.split}{'-pf' if self.prefetch else ''}"


@functools.lru_cache(maxsize=None)
def default_config(n: int, kw: int, sms: int = INTERPRETER_SMS) -> WNA16TCConfig:
    """2 tiles, 2 chunks, prefetch; K (kw words) split by `auto_split`."""
    return auto_split(WNA16TCConfig(), n, kw, sms)


def auto_split(cfg: WNA16TCConfig, n: int, kw: int, sms: int) -> WNA16TCConfig:
    """cfg with K (kw words) split by lamina.kernels.wna16_row.split_count."""
    return replace(cfg, split=split_count(triton.cdiv(n, 16 * cfg.tiles), kw // (CHUNK_WORDS * cfg.chunks), sms))


@triton.jit
def _load_words(w_ptr, ra, rb, stride_wn, kw0, col):
    """The step's words of rows g (ra) and g + 8 (rb) of each tile."""
    wa = tl.load(w_ptr + ra * stride_wn + kw0 + col, eviction_policy="evict_first")
    wb = tl.load(w_ptr + rb * stride_wn + kw0 + col, eviction_policy="evict_first")
    return wa, wb


@triton.jit
def _row_params(ptr, ra, rb, stride, grp, slot_a, other, COMPILED: tl.constexpr):
    """A per-row, per-group parameter (scale, zero point) of each slot's weight row, as float32, + other."""
    pa = load_f32(ptr + ra * stride + grp, COMPILED)
    pb = load_f32(ptr + rb * stride + grp, COMPILED)
    return tl.where(slot_a, pa, pb) + other


@triton.jit
def _block_sums(wa, wb, frags, scale, zb, BITS: tl.constexpr, TILES: tl.constexpr, CHUNKS: tl.constexpr,
                HAS_ZERO: tl.constexpr, COMPILED: tl.constexpr):
    """One block of 8 rows of x over a K step: the sum over its chunks of scale * (D - zb * sum(x)), [8, TILES, 16]
    (int8 without zero points: zb = 0, no x sums)."""
    d = mma_chain(wa, wb, frags, BITS, TILES, CHUNKS, COMPILED)
    if HAS_ZERO or BITS == 4:
        d -= zb * x_sums(frags, BITS, CHUNKS, COMPILED)
    return tl.sum(scale * d, axis=2)


@triton.jit
def _store_out(acc, acc2, rows, ms, mask, mask2, b_ptr, out_ptr, stride_om, M, HAS_BIAS: tl.constexpr,
               XB: tl.constexpr, COMPILED: tl.constexpr):
    """out[ms, rows] = acc (+ bias), and out[ms + 8, rows] = acc2 with two blocks of x's rows (XB 2)."""
    if HAS_BIAS:
        bias = load_f32(b_ptr + rows, COMPILED)
        acc += bias
        acc2 += bias
    store_f32(out_ptr + ms * stride_om + rows, acc, mask, COMPILED)
    if XB == 2:
        store_f32(out_ptr + tl.minimum(ms + 8, M - 1) * stride_om + rows, acc2, mask2, COMPILED)


@triton.jit
def _finish(acc, acc2, rows, ms, b_ptr, out_ptr, stride_om, ws_ptr, cnt_ptr, M, N, split, block,
            HAS_BIAS: tl.constexpr, IS_SPLIT: tl.constexpr, XB: tl.constexpr, COMPILED: tl.constexpr):
    """Store acc (+ bias) at out[ms, rows] and acc2 at out[ms + 8, rows] (rows < N, rows of x < M); split K:
    partials to ws[split index, m, n], the last program of the row block to arrive adds them in split order
    (lamina.kernels.wna16_row's scheme)."""
    mask = (rows < N) & (ms < M)
    mask2 = (rows < N) & (ms + 8 < M)
    rows = tl.minimum(rows, N - 1)  # in bounds: loads unmasked
    ms = tl.minimum(ms, M - 1)
    if IS_SPLIT:
        ms2 = tl.minimum(ms + 8, M - 1)
        store_f32(ws_ptr + (tl.program_id(1) * M + ms) * N + rows, acc, mask, COMPILED)
        if XB == 2:
            store_f32(ws_ptr + (tl.program_id(1) * M + ms2) * N + rows, acc2, mask2, COMPILED)
        tl.debug_barrier()  # every lane's partials written before the release below
        done = tl.atomic_add(cnt_ptr + block, 1, sem="acq_rel")
        if done == split - 1:
            acc = tl.zeros_like(acc)
            acc2 = tl.zeros_like(acc2)
            for sp in range(split):
                acc += load_f32(ws_ptr + (sp * M + ms) * N + rows, COMPILED)
                if XB == 2:
                    acc2 += load_f32(ws_ptr + (sp * M + ms2) * N + rows, COMPILED)
            _store_out(acc, acc2, rows, ms, mask, mask2, b_ptr, out_ptr, stride_om, M, HAS_BIAS, XB, COMPILED)
            tl.store(cnt_ptr + block, 0)
    else:
        _store_out(acc, acc2, rows, ms, mask, mask2, b_ptr, out_ptr, stride_om, M, HAS_BIAS, XB, COMPILED)


@triton.jit(do_not_specialize=["split"])  # one compile for every split count > 1
def _wna16_tc_kernel(x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, KW, split,
                     stride_xm, stride_om, stride_wn, stride_sn, stride_zn,
                     BITS: tl.constexpr, XOR: tl.constexpr, GROUP_KW: tl.constexpr, HAS_ZERO: tl.constexpr,
                     HAS_BIAS: tl.constexpr, TILES: tl.constexpr, CHUNKS: tl.constexpr, IS_SPLIT: tl.constexpr,
                     PREFETCH: tl.constexpr, XB: tl.constexpr, PDL: tl.constexpr, COMPILED: tl.constexpr):
    """x_ptr: x as int32 bf16 pairs (row stride stride_xm pairs); XB blocks of 8 rows of x (1 or 2: each word's
    A fragments feed one MMA chain a block). Rows past N are clamped for the loads and masked at the store;
    x's rows past M are clamped (their MMA columns are never stored)."""
    STEP: tl.constexpr = 16 * CHUNKS
    g = tl.arange(0, 8)[:, None, None, None]
    tj = tl.arange(0, 16)[None, None, None, :]
    slot_a = tj % 4 < 2
    chunk = tl.arange(0, CHUNKS)[None, None, :, None] * 16  # the chunks' first words, [1, 1, CHUNKS, 1]
    col = chunk + tj  # word of the step, [1, 1, CHUNKS, 16]
    block = tl.program_id(0)
    row_a = block * (16 * TILES) + 16 * tl.arange(0, TILES)[None, :, None, None] + g  # [8, TILES, 1, 1]
    ra = tl.minimum(row_a, N - 1).to(tl.int64)
    rb = tl.minimum(row_a + 8, N - 1).to(tl.int64)
    PAIRS: tl.constexpr = 16 // BITS  # x's int32 pairs a word: 4 (int4) or 2 (int8)
    x_offs = tl.minimum(g, M - 1) * stride_xm + PAIRS * col  # [8, 1, CHUNKS, 16]
    x_offs2 = tl.minimum(g + 8, M - 1) * stride_xm + PAIRS * col  # the second block of x's rows
    kw_len = tl.cdiv(tl.cdiv(KW, STEP), split) * STEP
    kw_lo = tl.program_id(1) * kw_len
    kw_hi = tl.minimum(KW, kw_lo + kw_len)
    acc = tl.zeros([8, TILES, 16], dtype=tl.float32)
    acc2 = tl.zeros([8, TILES, 16], dtype=tl.float32)  # x's rows 8..15 (XB 2)
    if PREFETCH:
        wa, wb = _load_words(w_ptr, ra, rb, stride_wn, tl.minimum(kw_lo, KW - STEP), col)  # a split may be empty
    pdl.wait(PDL)  # the first words are on their way; x may be the kernel before's output
    for kw0 in range(kw_lo, kw_hi, STEP):
        if PREFETCH:
            cur_a, cur_b = wa, wb
            wa, wb = _load_words(w_ptr, ra, rb, stride_wn, tl.minimum(kw0 + STEP, KW - STEP), col)
        else:
            cur_a, cur_b = _load_words(w_ptr, ra, rb, stride_wn, kw0, col)
        if XOR != 0:  # naive int8: signed bytes to offset binary
            cur_a, cur_b = cur_a ^ XOR, cur_b ^ XOR
        grp = (kw0 + chunk) // GROUP_KW  # the chunk's group
        scale = _row_params(s_ptr, ra, rb, stride_sn, grp, slot_a, 0.0, COMPILED)
        zb = 136.0 if BITS == 4 else 0.0  # what the A values carry beyond q - z: 128 + 8 (+ z) at int4, (z) at int8
        if HAS_ZERO:
            zb = _row_params(z_ptr, ra, rb, stride_zn, grp, slot_a, zb, COMPILED)
        frags = x_frags(x_ptr, x_offs + PAIRS * kw0, BITS, COMPILED)
        acc += _block_sums(cur_a, cur_b, frags, scale, zb, BITS, TILES, CHUNKS, HAS_ZERO, COMPILED)
        if XB == 2:
            frags2 = x_frags(x_ptr, x_offs2 + PAIRS * kw0, BITS, COMPILED)
            acc2 += _block_sums(cur_a, cur_b, frags2, scale, zb, BITS, TILES, CHUNKS, HAS_ZERO, COMPILED)
    pdl.launch_dependents(PDL)  # the weights are read: the next kernel may be placed
    t3 = tl.arange(0, 16)[None, None, :]
    rows = (block * (16 * TILES) + 16 * tl.arange(0, TILES)[None, :, None] + tl.arange(0, 8)[:, None, None]
            + 8 * (t3 % 4 >= 2))
    ms = 2 * (t3 // 4) + t3 % 2
    _finish(acc, acc2, rows, ms, b_ptr, out_ptr, stride_om, ws_ptr, cnt_ptr, M, N, split, block, HAS_BIAS,
            IS_SPLIT, XB, COMPILED)


def wna16_tc_gemv(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
                  bias: torch.Tensor | None, num_bits: int, group_size: int | None, xor: int = 0,
                  config: WNA16TCConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M, K] bf16 (M <= MAX_M) @ dequantize(words, scale, zero_point).T (+ bias) -> [M, N] bf16; `takes` says
    which operands, lamina.kernels.wna16_row's signature (xor: a naive int8 weight viewed as int32 words, with
    lamina.kernels.wna16_gemv.NAIVE_INT8_XOR). group_size None: per channel (scale [N, 1]). pdl: launch with
    programmatic dependent launch (lamina.kernels.pdl)."""
    check_inputs(x, words, scale, zero_point, bias, num_bits)
    (m, k), (n, kw) = x.shape, words.shape
    assert takes(x.dtype, m, k, num_bits, group_size), \
        f"wna16_tc_gemv takes 1..{MAX_M} bf16 rows of 4- or 8-bit weights, K and groups whole chunks of " \
        f"{CHUNK_WORDS} words; got {x.dtype} {tuple(x.shape)}, {num_bits} bits, group {group_size}"
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    cfg = config or default_config(n, kw, num_sms(x.device))
    if x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:  # 16-byte loads of x
        x = x.clone(memory_format=torch.contiguous_format)
    blocks = triton.cdiv(n, 16 * cfg.tiles)
    chunks = cfg.chunks if kw % (CHUNK_WORDS * cfg.chunks) == 0 else 1
    split = min(cfg.split, kw // (CHUNK_WORDS * chunks))
    ws, cnt = workspace(x.device, m * n, split, blocks) if split > 1 else (out, out)  # never read unsplit
    z = scale if zero_point is None else zero_point  # never read without HAS_ZERO
    _wna16_tc_kernel[(blocks, split)](
        x.view(torch.int32), words, scale, z, out if bias is None else bias, out, ws, cnt, m, n, kw, split,
        x.stride(0) // 2, out.stride(0), words.stride(0), scale.stride(0), z.stride(0),
        BITS=num_bits, XOR=xor, GROUP_KW=CHANNEL_GROUP if group_size is None else group_size // (32 // num_bits),
        HAS_ZERO=zero_point is not None,
        HAS_BIAS=bias is not None, TILES=cfg.tiles, CHUNKS=chunks, IS_SPLIT=split > 1, PREFETCH=cfg.prefetch,
        XB=1 if m <= 8 else 2,
        PDL=pdl, COMPILED=compiled(x), num_warps=1, num_stages=1, launch_pdl=pdl)
    return out

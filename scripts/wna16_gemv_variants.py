"""Alternative W4A16 / W8A16 GEMV kernels for one row of x (decode, issue #13), checked and timed on the GPU.

    python scripts/wna16_gemv_variants.py             # CUDA: every variant on the Llama-3-8B shapes (~3-4 min)
    python scripts/wna16_gemv_variants.py --quick     # CUDA: one config family per variant
    python scripts/wna16_gemv_variants.py --tiny      # any machine: every variant through the interpreter (CPU)
    python scripts/wna16_gemv_variants.py --sass      # any machine: compile for sm_90a ahead of time, count SASS

Why the current kernel (lamina/kernels/wna16_gemv.py) is slow
-------------------------------------------------------------
At one row the GEMV should be a pure weight stream (H200 ~4.6 TB/s: int4 g128 is 4.2 bytes a 32-bit word with
its scales, ~1.1e12 words/s), but the K loop of its default config (n4-kw512-w4, sm_90a SASS, `--sass`) issues
~54 instructions per word: twice what 132 SMs can issue at that rate (~3.3e13 thread-instructions/s), so it is
issue-bound (measured 1.1-1.5 TB/s). The instructions go to a shared-memory layout conversion of x every tile
(STS / LDS / BAR), an integer division for the group index, an FADD per weight (the exact 2^23-magic unpack) on
top of its LOP3 and FFMA, and x's splits. The variants below were designed by SASS instructions per word.

Variants (Triton kernels below, each with its design in its docstring; no inline asm: all run in the interpreter)
-----------------------------------------------------------------------------------------------------------------
rowpair   Native layout, no repack. A program owns BLOCK_N rows, each row its own 1-D tensor over the tile's words
          (rows unrolled with tuples), so the weight tiles, x's tile and the scale / zero-point loads all get one
          register layout: thread t owns words 4t..4t+3 of every row (a 16-byte load per row) and x's 64 bytes for
          them (four 16-byte loads, converted once for all BLOCK_N rows). No layout conversion, no shared memory,
          no division in the K loop; one lane reduction per row at the end (1-warp programs: shuffles only).
          Unpack two nibbles per LOP3 ("pair" trick; magic 128.0 in a register, 65536 in a register so the
          shift-add is an IMAD on the FMA pipe, not a LEA on the ALU pipe):
              t  = ((w >> 4j) & 0x000F000F) | 0x43000000    float bits = 128 + u[j+4] + u[j] * 2^-16
              t2 = t * 65536 + 0x43000000                   float bits = 128 + u[j]   (exact)
          and one FFMA per weight: 3 SHF + 4 LOP3 + 4 IMAD + 8 FFMA = 19 per word. The 128 bias, the storage
          offset 8 and the zero point go once per 4-word chunk and row: s * (sum - (136 + z) * sum x). The
          u[j] * 2^-16 leak is ~1e-5 of an output (a bf16 ulp is 4e-3); products are exact, sums fp32. int8: a
          byte into bits 8..15 of 32768.0 (32768 + u), 1-2 ALU ops + 1 FFMA a weight. K can be split over
          `split` programs (runtime argument): fp32 partials, an atomic counter per row block, the last program
          to arrive adds them in split order (deterministic) and re-zeroes the counter (one launch, graph-safe).
          Optional register prefetch of the next tile. SASS: 24-27 instructions per int4 word (BLOCK_N 16 / 8),
          15.5 per int8 word. Expect ~2x the current kernel where it is issue-bound (all shapes at 1 row).
kmajor    GemLite-style K-major layout: `kmajor_repack` (once, at load) transposes words to [K/8, N] and packs
          scale + (136 + z) into one int32 [groups, N]. Lanes run along N (4 output columns a thread, a 16-byte
          load per word-row); a thread walks a contiguous K range keeping its columns' sums in registers: no
          cross-lane reduction at all; x's pairs of a word-row are warp-uniform scalar loads. Same unpack and bias
          algebra; split K as rowpair. SASS: ~24 per word. Needs large splits at small N.
tc        Tensor cores through tl.dot (wgmma on sm_90), "swap AB": the weight tile [BLOCK_N, 128] is the MMA's
          left operand, x (broadcast to the 16 columns tl.dot needs) the right one. Marlin-style unpack straight
          into packed bf16 operands: ((w >> 4j) & 0x000F000F) | 0x43004300 = bf16x2(128 + u[j], 128 + u[j+4]),
          3 SHF + 4 LOP3 per word and no FFMA (exact products, fp32 accumulation in the MMA). K is permuted
          inside each 128-value step so those pairs stay adjacent (x is permuted the same way in registers): no
          reordering shuffles. The bias and zero point are removed once per program from per-step sums of x;
          the scale multiplies each step's MMA result. Triton stages the operand through shared memory (one
          STS.128 + one LDSM a word). SASS: ~14 per word (16 with prefetch) plus a per-program prologue;
          int4 only, K and the group size in multiples of 128.

Check: each config's output against an fp32 reference (w = (q - 8 - z) * s in fp32, x @ w.T in fp32): every
output within 2^-8 of itself (bf16 rounding) + 2^-12 of the largest. Timing: CUDA graphs of calls rotating
weight copies through > 256 MB (lamina.bench.gemv_sweep._time_per_call, do_bench median), like
lamina.bench.quant_speed; GB/s counts words + scales + zero points. A config that fails (compile error, out of
resources, wrong answer) is recorded and skipped; no new config starts after --budget-s. JSON:
$OUT/gemv-variants.json ($OUT default ./out); table printed last.

Integration notes: x must be bf16 and contiguous (rowpair / kmajor read it as int32 pairs of bf16). rowpair and
tc read the checkpoint layout as is; kmajor needs kmajor_repack at load time. Split-K configs use a cached
fp32 workspace [split, N] and an int32 counter per row block that must start zeroed (the kernels leave them
zeroed): allocate outside graph capture, one stream at a time per workspace.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

if "--tiny" in sys.argv:
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 (+ interpreter fixes) before triton

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def _interpreter_round_to_nearest() -> None:
    """The interpreter truncates float32 -> bf16 casts (the GPU rounds to nearest even): round like the GPU, so
    --tiny checks the kernels to the tolerance the GPU run uses (tests/kernels/conftest.py's fixture, as code)."""
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):  # noqa: ANN001, ANN202 - interpreter internals
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            bits = data.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(bits, tl.bfloat16)
        return original(self, src, dst_type)

    interpreter.InterpreterBuilder.cast_impl = cast_impl


if "--tiny" in sys.argv:
    _interpreter_round_to_nearest()

MAGIC4 = 0x43000000  # float32 128.0: a nibble at bits 16..19 reads as 128 + u
MAGIC8 = 0x47000000  # float32 32768.0: a byte at bits 8..15 reads as 32768 + u
MAGIC_BF16X2 = 0x43004300  # two bf16 128.0: a nibble at bits 0..3 / 16..19 reads as 128 + u in each half
TOLERANCE = (2 ** -8, 2 ** -12)  # |out - ref| <= 2^-8 |ref| (bf16 rounding) + 2^-12 max |ref|


# ---------------------------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _i2f(v):
    """float(v) for integers |v| < 2^22: one IADD and one FADD (I2F issues at a quarter of the FP32 rate)."""
    return (v + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _lo(p):
    """The low bf16 of an int32 holding two (x[2i] in bits 0..15, x[2i+1] in 16..31), as float32: one op."""
    return (p << 16).to(tl.float32, bitcast=True)


@triton.jit
def _hi(p):
    """The high bf16 of such a pair as float32: one op."""
    return (p & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _unzip(t, A: tl.constexpr, B: tl.constexpr):
    """Tuple of [A, 2B] tensors -> tuple of twice as many [A, B]: every even column block, then every odd one.
    After k calls on (v,), v [A, 2^k], item i is v[:, i]; register-only when a row's 2^k values sit in one thread."""
    evens = ()
    odds = ()
    for i in tl.static_range(len(t)):
        if B == 1:
            e, o = tl.split(t[i])
        else:
            e, o = tl.split(tl.reshape(t[i], (A, B, 2)))
        evens = evens + (e,)
        odds = odds + (o,)
    return evens + odds


@triton.jit
def _columns4(v, A: tl.constexpr):
    """[A, 4] -> its 4 columns [A] as a tuple."""
    return _unzip(_unzip((v,), A, 2), A, 1)


@triton.jit
def _int4_word(acc, w, p0, p1, p2, p3, magic, m16):
    """acc + sum_j (128 + u_j) x_j over the 8 nibbles u_j of each word w (x_0..x_7 in the bf16 pairs p0..p3):
    3 SHF, 4 LOP3 (mask | magic, magic in a register), 4 IMAD (m16 = 65536 in a register: not a LEA), 8 FFMA."""
    t = (w & 0x000F000F) | magic
    acc += t.to(tl.float32, bitcast=True) * _lo(p2)
    acc += (t * m16 + magic).to(tl.float32, bitcast=True) * _lo(p0)
    t = ((w >> 4) & 0x000F000F) | magic
    acc += t.to(tl.float32, bitcast=True) * _hi(p2)
    acc += (t * m16 + magic).to(tl.float32, bitcast=True) * _hi(p0)
    t = ((w >> 8) & 0x000F000F) | magic
    acc += t.to(tl.float32, bitcast=True) * _lo(p3)
    acc += (t * m16 + magic).to(tl.float32, bitcast=True) * _lo(p1)
    t = ((w >> 12) & 0x000F000F) | magic
    acc += t.to(tl.float32, bitcast=True) * _hi(p3)
    acc += (t * m16 + magic).to(tl.float32, bitcast=True) * _hi(p1)
    return acc


@triton.jit
def _int8_word(acc, w, p0, p1, magic8):
    """acc + sum_j (32768 + u_j) x_j over the 4 bytes u_j of each word (x_0..x_3 in the bf16 pairs p0, p1)."""
    acc += (((w << 8) & 0xFF00) | magic8).to(tl.float32, bitcast=True) * _lo(p0)
    acc += ((w & 0xFF00) | magic8).to(tl.float32, bitcast=True) * _hi(p0)
    acc += (((w >> 8) & 0xFF00) | magic8).to(tl.float32, bitcast=True) * _lo(p1)
    acc += (((w >> 16) & 0xFF00) | magic8).to(tl.float32, bitcast=True) * _hi(p1)
    return acc


@triton.jit
def _finish(tot, rows, row_mask, out_ptr, ws_ptr, cnt_ptr, N, split, block, IS_SPLIT: tl.constexpr):
    """Write fp32 row sums `tot` as out's dtype; split K: partials to ws[split index, N], counter per row block,
    the last program of the block adds them up in split order (deterministic) and resets the counter."""
    if not IS_SPLIT:
        tl.store(out_ptr + rows, tot.to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        tl.store(ws_ptr + tl.program_id(1) * N + rows, tot, mask=row_mask)
        tl.debug_barrier()  # every thread's partials written before the release below
        done = tl.atomic_add(cnt_ptr + block, 1, sem="acq_rel")
        if done == split - 1:
            total = tl.zeros_like(tot)
            for sp in range(split):
                total += tl.load(ws_ptr + sp * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=row_mask)
            tl.store(cnt_ptr + block, 0)


# ---------------------------------------------------------------------------------------------------------------
# Variant rowpair
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _rowpair_load_w(w_ptr, rptr, stride_wn, kw0, cols, limit, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                    SCALAR_MASK: tl.constexpr):
    tiles = ()
    for r in tl.static_range(BLOCK_N):
        ptrs = w_ptr + rptr[r] * stride_wn + kw0 + cols
        if not MASKED:
            w = tl.load(ptrs, eviction_policy="evict_first")
        elif SCALAR_MASK:  # whole tiles: one predicate, the 16-byte loads stay vectorised
            w = tl.load(ptrs, mask=(kw0 < limit) & (cols >= 0), other=0, eviction_policy="evict_first")
        else:
            w = tl.load(ptrs, mask=kw0 + cols < limit, other=0, eviction_policy="evict_first")
        tiles = tiles + (w,)
    return tiles


@triton.jit(do_not_specialize=["split"])  # one compile for every split count > 1
def _rowpair_kernel(x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, ws_ptr, cnt_ptr, N, KW, split,
                    stride_wn, stride_sn, stride_zn, magic, m16,
                    BITS: tl.constexpr, XOR: tl.constexpr, GROUP_KW: tl.constexpr, HAS_ZERO: tl.constexpr,
                    EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, IS_SPLIT: tl.constexpr,
                    PREFETCH: tl.constexpr):
    """out[n] = sum_k x[k] * (u[n, k] - OFFSET - z[n, g]) * s[n, g] for BLOCK_N rows n, native layout.

    Grid (cdiv(N, BLOCK_N), split). x_ptr: x as int32 bf16 pairs [K / 2]. Each row is a 1-D tensor over the
    tile's BLOCK_KW words (unrolled over rows with tuples), so weights, x and scales share one register layout
    (thread t: words 4t..4t+3 of each row; 16-byte loads) and the loop has no layout conversion. Per 4-word
    chunk c and row: part = sum (BIAS + u) x (pair trick, see the module docstring), then
    acc += s * (part - (BIAS + OFFSET + z) * sum x); one lane reduction per row at the end. The chunk lies in
    one quantization group (GROUP_KW, words per group, a multiple of 4). Rows past N are clamped for the loads,
    masked at the store; K tiles are masked only when BLOCK_KW does not divide KW (EVEN_K False).
    split > 1: program (i, j) walks the j-th of `split` runs of whole tiles; see _finish."""
    C: tl.constexpr = BLOCK_KW // 4
    PAIRS: tl.constexpr = 16 // BITS  # int32 pairs of x per word: 4 (int4) or 2 (int8)
    ZB: tl.constexpr = 136 if BITS == 4 else 32896  # 128 + 8 or 32768 + 128: the magic bias + storage offset
    block = tl.program_id(0)
    row0 = block * BLOCK_N
    cols = tl.arange(0, BLOCK_KW)
    offs_c = tl.arange(0, C)
    x_offs = offs_c[:, None] * (4 * PAIRS) + tl.arange(0, 4)[None, :]  # 16 bytes of x per load and thread
    accs = ()
    rptr = ()
    for r in tl.static_range(BLOCK_N):
        accs = accs + (tl.zeros([C], dtype=tl.float32),)
        rptr = rptr + (tl.minimum(row0 + r, N - 1).to(tl.int64),)
    kw_len = tl.cdiv(tl.cdiv(KW, BLOCK_KW), split) * BLOCK_KW
    kw_lo = tl.program_id(1) * kw_len
    kw_hi = tl.minimum(KW, kw_lo + kw_len)
    if PREFETCH:
        cur = _rowpair_load_w(w_ptr, rptr, stride_wn, kw_lo, cols, kw_hi, BLOCK_N, True, EVEN_K)
    for kw0 in range(kw_lo, kw_hi, BLOCK_KW):
        if PREFETCH:
            tiles = cur
            cur = _rowpair_load_w(w_ptr, rptr, stride_wn, kw0 + BLOCK_KW, cols, kw_hi, BLOCK_N, True, EVEN_K)
        else:
            tiles = _rowpair_load_w(w_ptr, rptr, stride_wn, kw0, cols, KW, BLOCK_N, not EVEN_K, False)
        xb = x_ptr + kw0 * PAIRS + x_offs
        xq = ()  # item q: pair q of the chunk's 4 words (q = PAIRS * word + pair)
        for i in tl.static_range(PAIRS):
            if EVEN_K:
                xp = tl.load(xb + 4 * i)
            else:
                xp = tl.load(xb + 4 * i, mask=(kw0 + offs_c * 4 + (4 * i) // PAIRS)[:, None]
                             + tl.arange(0, 4)[None, :] // PAIRS < KW, other=0)
            xq = xq + _columns4(xp, C)
        xs = tl.zeros([C], dtype=tl.float32)
        for q in tl.static_range(4 * PAIRS):
            xs += _lo(xq[q]) + _hi(xq[q])
        g = (kw0 + offs_c * 4) // GROUP_KW
        gmask = kw0 + offs_c * 4 < KW
        new = ()
        for r in tl.static_range(BLOCK_N):
            w = tiles[r]
            if XOR != 0:
                w = w ^ XOR
            wq = _columns4(tl.reshape(w, (C, 4)), C)
            part = tl.zeros([C], dtype=tl.float32)
            for v in tl.static_range(4):
                if BITS == 4:
                    part = _int4_word(part, wq[v], xq[4 * v], xq[4 * v + 1], xq[4 * v + 2], xq[4 * v + 3], magic, m16)
                else:
                    part = _int8_word(part, wq[v], xq[2 * v], xq[2 * v + 1], magic)
            if EVEN_K:
                s = tl.load(s_ptr + rptr[r] * stride_sn + g).to(tl.float32)
            else:
                s = tl.load(s_ptr + rptr[r] * stride_sn + g, mask=gmask, other=0.0).to(tl.float32)
            if HAS_ZERO:
                if EVEN_K:
                    z = tl.load(z_ptr + rptr[r] * stride_zn + g)
                else:
                    z = tl.load(z_ptr + rptr[r] * stride_zn + g, mask=gmask, other=0)
                zb = _i2f(z.to(tl.int32) + ZB)
                new = new + (accs[r] + s * (part - zb * xs),)
            else:
                new = new + (accs[r] + s * (part - ZB * xs),)
        accs = new
    ro = tl.arange(0, BLOCK_N)
    tot = tl.zeros([BLOCK_N], dtype=tl.float32)
    for r in tl.static_range(BLOCK_N):
        tot = tl.where(ro == r, tl.sum(accs[r], axis=0), tot)
    rows = row0 + ro
    _finish(tot, rows, rows < N, out_ptr, ws_ptr, cnt_ptr, N, split, block, IS_SPLIT)


@dataclass(frozen=True)
class RowpairConfig:
    block_n: int  # rows per program
    num_warps: int = 1
    reps: int = 1  # 16-byte chunks per thread and row per tile: BLOCK_KW = 128 * num_warps * reps words
    split: int = 1  # programs along K (runtime: no recompile)
    prefetch: bool = True  # load the next weight tile into registers before using this one

    @property
    def block_kw(self) -> int:
        return 128 * self.num_warps * self.reps

    @property
    def name(self) -> str:
        return (f"n{self.block_n}-w{self.num_warps}-kw{self.block_kw}-s{self.split}"
                f"{'-pf' if self.prefetch else ''}")


_WORKSPACES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, n: int, split: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partials [split, n] and zeroed counters [blocks] (the kernels leave them zeroed): allocate outside
    CUDA graph capture (the timing harness calls every config once before capturing)."""
    key = (str(device), n, split, blocks)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = (torch.empty((split, n), dtype=torch.float32, device=device),
                            torch.zeros((blocks,), dtype=torch.int32, device=device))
    return _WORKSPACES[key]


def _group_words(bits: int, group_size: int | None, k: int) -> int:
    """Words per quantization group: a multiple of the 4-word chunk (asserted), or all of K (channel)."""
    per_word = 32 // bits
    if group_size is None:
        return 1 << 30
    assert group_size % (4 * per_word) == 0, f"group size {group_size} must be a multiple of {4 * per_word}"
    return group_size // per_word


def rowpair_gemv(x: torch.Tensor, op: dict[str, Any], cfg: RowpairConfig) -> torch.Tensor:
    """x [1, K] bf16 / fp16 (contiguous) @ dequantize(op).T -> [1, N]; op: words [N, KW], scale, zero, bits, ..."""
    words, scale, zero, bits = op["words"], op["scale"], op["zero"], op["bits"]
    n, kw = words.shape
    k = x.shape[1]
    assert x.shape[0] == 1 and x.is_contiguous() and k == kw * (32 // bits), "x must be contiguous [1, K]"
    assert x.dtype == torch.bfloat16, "x is read as bf16 pairs"
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(n, cfg.block_n)
    split = max(1, min(cfg.split, triton.cdiv(kw, cfg.block_kw)))
    ws, cnt = _workspace(x.device, n, split, blocks) if split > 1 else (out, out)
    z = scale if zero is None else zero  # never read without HAS_ZERO
    _rowpair_kernel[(blocks, split)](
        x.view(torch.int32), words, scale, z, out, ws, cnt, n, kw, split,
        words.stride(0), scale.stride(0), z.stride(0), MAGIC4 if bits == 4 else MAGIC8, 65536,
        BITS=bits, XOR=op.get("xor", 0), GROUP_KW=_group_words(bits, op["group_size"], k),
        HAS_ZERO=zero is not None, EVEN_K=kw % cfg.block_kw == 0, BLOCK_N=cfg.block_n, BLOCK_KW=cfg.block_kw,
        IS_SPLIT=split > 1, PREFETCH=cfg.prefetch, num_warps=cfg.num_warps, num_stages=1)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Variant kmajor
# ---------------------------------------------------------------------------------------------------------------
def kmajor_repack(op: dict[str, Any]) -> dict[str, Any]:
    """One-time repack for `kmajor`: words [N, KW] -> [KW, N] (each word still 32 / bits consecutive K values of
    one row), and scale + zero point -> one int32 [groups, N]: bf16 scale bits << 16 | (ZB + z) (ZB = 136 at 4 bits,
    32896 at 8: the magic bias plus the storage offset): 4 bytes a group against the native 3 (2 symmetric), +0.2%
    of int4 g128's bytes (GB/s in the table count the native bytes)."""
    bits, scale, zero = op["bits"], op["scale"], op["zero"]
    assert scale.dtype == torch.bfloat16, "meta holds the scale's bf16 bits"
    zb = (136 if bits == 4 else 32896) + (0 if zero is None else zero.to(torch.int32))
    sbits = scale.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    meta = ((sbits << 16) | (zb & 0xFFFF)).to(torch.int32)  # int32 arithmetic wraps: the bits are what count
    return dict(op, words_t=op["words"].t().contiguous(), meta_t=meta.t().contiguous())


@triton.jit(do_not_specialize=["split"])  # one compile for every split count > 1
def _kmajor_kernel(x_ptr, wt_ptr, mt_ptr, out_ptr, ws_ptr, cnt_ptr, N, KW, split, magic, m16,
                   BITS: tl.constexpr, XOR: tl.constexpr, GROUP_KW: tl.constexpr, ROWS: tl.constexpr,
                   EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, IS_SPLIT: tl.constexpr):
    """GemLite-style K-major GEMV: out[n] = sum over K of x * dequantized W[n, :], from words_t [KW, N] and
    meta_t [groups, N] (kmajor_repack). Grid (cdiv(N, BLOCK_N), split). A program owns BLOCK_N output columns
    (thread t: 4 consecutive ones, a 16-byte load per word-row) and walks its K range ROWS word-rows at a time
    (ROWS divides the group's words GROUP_KW, or K when per channel); each thread keeps its columns' sums in
    registers for the whole range: no cross-lane reduction. x's pairs for a word-row are scalar loads (the same
    address in every lane). Per ROWS word-rows: part = sum (BIAS + u) x, acc += s * (part - (ZB + z) sum x), with
    s and ZB + z from one int32 of meta. split > 1: see _finish."""
    PAIRS: tl.constexpr = 16 // BITS
    pid_n = tl.program_id(0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    cols_c = tl.minimum(cols, N - 1)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    kw_len = tl.cdiv(tl.cdiv(KW, ROWS), split) * ROWS
    kw_lo = tl.program_id(1) * kw_len
    kw_hi = tl.minimum(KW, kw_lo + kw_len)
    for kw0 in range(kw_lo, kw_hi, ROWS):
        part = tl.zeros([BLOCK_N], dtype=tl.float32)
        xs = 0.0
        for r in tl.static_range(ROWS):
            kw = kw0 + r
            if EVEN_K:
                if EVEN_N:
                    w = tl.load(wt_ptr + kw.to(tl.int64) * N + cols, eviction_policy="evict_first")
                else:
                    w = tl.load(wt_ptr + kw.to(tl.int64) * N + cols_c, eviction_policy="evict_first")
                xq = ()
                for p in tl.static_range(PAIRS):
                    xq = xq + (tl.load(x_ptr + kw * PAIRS + p),)
            else:
                w = tl.load(wt_ptr + kw.to(tl.int64) * N + cols_c, mask=kw < KW, other=0,
                            eviction_policy="evict_first")
                xq = ()
                for p in tl.static_range(PAIRS):
                    xq = xq + (tl.load(x_ptr + kw * PAIRS + p, mask=kw < KW, other=0),)
            if XOR != 0:
                w = w ^ XOR
            for p in tl.static_range(PAIRS):
                xs += _lo(xq[p]) + _hi(xq[p])
            if BITS == 4:
                part = _int4_word(part, w, xq[0], xq[1], xq[2], xq[3], magic, m16)
            else:
                part = _int8_word(part, w, xq[0], xq[1], magic)
        if EVEN_N:
            meta = tl.load(mt_ptr + (kw0 // GROUP_KW) * N + cols)
        else:
            meta = tl.load(mt_ptr + (kw0 // GROUP_KW) * N + cols_c)
        acc += _hi(meta) * (part - _i2f(meta & 0xFFFF) * xs)
    _finish(acc, cols, col_mask, out_ptr, ws_ptr, cnt_ptr, N, split, pid_n, IS_SPLIT)


@dataclass(frozen=True)
class KmajorConfig:
    num_warps: int = 4
    rows: int = 8  # word-rows per inner step (divides the group's words)
    split: int = 1  # programs along K (runtime)
    cols_per_thread: int = 4  # 4: BLOCK_N = 128 * num_warps; 8: two 16-byte loads a word-row

    @property
    def block_n(self) -> int:
        return 32 * self.num_warps * self.cols_per_thread

    @property
    def name(self) -> str:
        return f"c{self.block_n}-w{self.num_warps}-r{self.rows}-s{self.split}"


def kmajor_gemv(x: torch.Tensor, op: dict[str, Any], cfg: KmajorConfig) -> torch.Tensor:
    """x [1, K] @ dequantize(op).T -> [1, N] from kmajor_repack(op)'s words_t / meta_t."""
    wt, mt, bits = op["words_t"], op["meta_t"], op["bits"]
    kw, n = wt.shape
    k = x.shape[1]
    assert x.shape[0] == 1 and x.is_contiguous() and k == kw * (32 // bits) and x.dtype == torch.bfloat16
    gkw = _group_words(bits, op["group_size"], k)
    rows = min(cfg.rows, gkw)
    assert gkw % rows == 0 or op["group_size"] is None
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(n, cfg.block_n)
    split = max(1, min(cfg.split, triton.cdiv(kw, rows)))
    ws, cnt = _workspace(x.device, n, split, blocks) if split > 1 else (out, out)
    _kmajor_kernel[(blocks, split)](
        x.view(torch.int32), wt, mt, out, ws, cnt, n, kw, split, MAGIC4 if bits == 4 else MAGIC8, 65536,
        BITS=bits, XOR=op.get("xor", 0), GROUP_KW=gkw, ROWS=rows, EVEN_N=n % cfg.block_n == 0,
        EVEN_K=kw % rows == 0, BLOCK_N=cfg.block_n, IS_SPLIT=split > 1, num_warps=cfg.num_warps, num_stages=1)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Variant tc
# ---------------------------------------------------------------------------------------------------------------
TC_STEP_KW = 16  # words per MMA step: 128 values of K


@triton.jit
def _bf16(v):
    """The low 16 bits of int32 v (< 2^15) as the bf16 they spell."""
    return v.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit(do_not_specialize=["split"])  # one compile for every split count > 1
def _tc_kernel(x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, ws_ptr, cnt_ptr, N, KW, split, stride_wn, stride_sn, stride_zn,
               magic2, GROUP_KW: tl.constexpr, HAS_ZERO: tl.constexpr, BLOCK_N: tl.constexpr, GMAX: tl.constexpr,
               IS_SPLIT: tl.constexpr, PREFETCH: tl.constexpr):
    """Tensor-core int4 GEMV: out.T [BLOCK_N, 16] = A [BLOCK_N, 128] @ B [128, 16] per 128-value step of K, the
    weight rows as the MMA's M side ("swap AB"), B = x (permuted, see below) broadcast to the 16 columns tl.dot
    needs at least. A is built from pairs: t_j = ((w >> 4j) & 0x000F000F) | 0x43004300 holds the bf16 values
    128 + u[j] (low half) and 128 + u[j + 4] (high half), i.e. t_j is already two packed MMA operand elements
    (3 SHF + 4 LOP3 per word, no packing PRMTs: checked in SASS). The joins / permute / reshape put the pairs in
    K order (wh, j1, j0, wl, e) for word 4 wh + wl of the step, value j0 + 2 j1 + 4 e; x is loaded contiguous
    and permuted the same way in registers (3-bit reversal of its index within each word). Per step:
    acc += s[g] * dot(A, B) (exact products, fp32 accumulation in the MMA). The bias 128 + 8 + z is removed once
    per program: corr = sum over its steps of s[g] * (136 + z[g]) * sum(x over the step), computed GMAX steps at a
    time before the loop. Needs K and the group size in multiples of 128 (GROUP_KW multiple of 16, or channel).
    PREFETCH: the next step's words are loaded into registers before this step's are used.
    Grid (cdiv(N, BLOCK_N), split): split runs of whole steps; see _finish."""
    BLOCK_K: tl.constexpr = 128
    block = tl.program_id(0)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_c = tl.minimum(rows, N - 1).to(tl.int64)
    cols16 = tl.arange(0, 16)
    offs_w = tl.arange(0, 16)
    steps = KW // 16
    per = tl.cdiv(steps, split)
    st_lo = tl.program_id(1) * per
    st_hi = tl.minimum(steps, st_lo + per)
    og = tl.arange(0, GMAX)
    corr = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(st_lo, st_hi, GMAX):
        sidx = c0 + og
        smask = sidx < st_hi
        xg = tl.load(x_ptr + sidx[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :], mask=smask[:, None], other=0.0)
        xsg = tl.sum(xg.to(tl.float32), axis=1)
        g = (sidx * 16) // GROUP_KW
        sg = tl.load(s_ptr + rows_c[:, None] * stride_sn + g[None, :], mask=smask[None, :], other=0.0).to(tl.float32)
        if HAS_ZERO:
            zg = tl.load(z_ptr + rows_c[:, None] * stride_zn + g[None, :], mask=smask[None, :], other=0)
            zg = zg.to(tl.float32) + 136.0
        else:
            zg = 136.0
        corr += tl.sum(sg * zg * xsg[None, :], axis=1)
    acc = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    w_rows = w_ptr + rows_c[:, None] * stride_wn + offs_w[None, :]
    if PREFETCH:
        nxt = tl.load(w_rows + st_lo * 16, mask=(st_lo < st_hi) & (offs_w[None, :] >= 0), other=0,
                      eviction_policy="evict_first")
    for st in range(st_lo, st_hi):
        kw0 = st * 16
        if PREFETCH:
            w = nxt
            nxt = tl.load(w_rows + kw0 + 16, mask=(st + 1 < st_hi) & (offs_w[None, :] >= 0), other=0,
                          eviction_policy="evict_first")
        else:
            w = tl.load(w_rows + kw0, eviction_policy="evict_first")
        t = (w & 0x000F000F) | magic2
        p0 = tl.reshape(tl.join(_bf16(t & 0xFFFF), _bf16(t >> 16)), (BLOCK_N, 4, 4, 2))  # [BN, wh, wl, e]
        t = ((w >> 4) & 0x000F000F) | magic2
        p1 = tl.reshape(tl.join(_bf16(t & 0xFFFF), _bf16(t >> 16)), (BLOCK_N, 4, 4, 2))
        t = ((w >> 8) & 0x000F000F) | magic2
        p2 = tl.reshape(tl.join(_bf16(t & 0xFFFF), _bf16(t >> 16)), (BLOCK_N, 4, 4, 2))
        t = ((w >> 12) & 0x000F000F) | magic2
        p3 = tl.reshape(tl.join(_bf16(t & 0xFFFF), _bf16(t >> 16)), (BLOCK_N, 4, 4, 2))
        a6 = tl.join(tl.join(p0, p1), tl.join(p2, p3))  # [BN, wh, wl, e, j0, j1]
        a = tl.reshape(tl.permute(a6, (0, 1, 5, 4, 2, 3)), (BLOCK_N, BLOCK_K))
        x8 = tl.load(x_ptr + kw0 * 8 + tl.arange(0, 16)[:, None] * 8 + tl.arange(0, 8)[None, :])
        xk = tl.reshape(tl.permute(tl.reshape(x8, (4, 4, 2, 2, 2)), (0, 3, 4, 1, 2)), (BLOCK_K,))
        d = tl.dot(a, tl.broadcast_to(xk[:, None], (BLOCK_K, 16)))
        s = tl.load(s_ptr + rows_c * stride_sn + kw0 // GROUP_KW).to(tl.float32)
        acc += s[:, None] * d
    tot = tl.sum(tl.where(cols16[None, :] == 0, acc, 0.0), axis=1) - corr
    _finish(tot, rows, rows < N, out_ptr, ws_ptr, cnt_ptr, N, split, block, IS_SPLIT)


@dataclass(frozen=True)
class TcConfig:
    block_n: int = 128
    num_warps: int = 4
    split: int = 1  # programs along K (runtime)
    num_stages: int = 1  # > 1: Triton pipelines the weight loads through shared memory (cp.async)
    prefetch: bool = False  # load the next step's words into registers before using this step's

    @property
    def name(self) -> str:
        return f"n{self.block_n}-w{self.num_warps}-s{self.split}-p{self.num_stages}{'-pf' if self.prefetch else ''}"


def tc_takes(op: dict[str, Any], k: int) -> bool:
    gs = op["group_size"]
    return op["bits"] == 4 and k % 128 == 0 and (gs is None or gs % 128 == 0)


def tc_gemv(x: torch.Tensor, op: dict[str, Any], cfg: TcConfig) -> torch.Tensor:
    """x [1, K] bf16 @ dequantize(op).T -> [1, N], int4, K and group size multiples of 128 (tc_takes)."""
    words, scale, zero = op["words"], op["scale"], op["zero"]
    n, kw = words.shape
    k = x.shape[1]
    assert x.shape[0] == 1 and x.is_contiguous() and x.dtype == torch.bfloat16 and tc_takes(op, k)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(n, cfg.block_n)
    split = max(1, min(cfg.split, kw // TC_STEP_KW))
    ws, cnt = _workspace(x.device, n, split, blocks) if split > 1 else (out, out)
    z = scale if zero is None else zero
    _tc_kernel[(blocks, split)](
        x, words, scale, z, out, ws, cnt, n, kw, split, words.stride(0), scale.stride(0), z.stride(0), MAGIC_BF16X2,
        GROUP_KW=_group_words(4, op["group_size"], k), HAS_ZERO=zero is not None, BLOCK_N=cfg.block_n,
        GMAX=16, IS_SPLIT=split > 1, PREFETCH=cfg.prefetch, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Harness
# ---------------------------------------------------------------------------------------------------------------
SHAPES = [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096)]  # Llama-3-8B, weight [N, K]
QUANTS = {"int4": (4, 128, False), "int8": (8, None, True)}  # bits, group size (None: channel), symmetric
TINY_SHAPES = [("tiny-a", 40, 384), ("tiny-b", 76, 640)]
TINY_QUANTS = {"int4": (4, 128, False), "int4-sym": (4, 128, True), "int4-g32": (4, 32, False),
               "int4-ch": (4, None, False), "int8": (8, None, True), "int8-g64": (8, 64, False)}
SM_COUNT = 132  # H200; replaced by the device's count on CUDA
WARPS_PER_SM = 16  # the split heuristic aims at about this many resident warps


def reference(x: torch.Tensor, op: dict[str, Any]) -> torch.Tensor:
    """fp32: (q - z) * s per group, x @ w.T; rows in chunks (lm_head's fp32 weight would be 2 GB at once)."""
    from lamina.quant.packing import unpack_int32

    words, scale, zero, bits = op["words"], op["scale"].float(), op["zero"], op["bits"]
    k = x.shape[1]
    out = torch.empty((1, words.shape[0]), dtype=torch.float32, device=x.device)
    for r in range(0, words.shape[0], 8192):
        q = unpack_int32(words[r:r + 8192], bits, k).float()
        g = scale.shape[1]
        q = q.view(q.shape[0], g, k // g)
        if zero is not None:
            q = q - zero[r:r + 8192].float()[:, :, None]
        out[:, r:r + 8192] = x.float() @ (q * scale[r:r + 8192, :, None]).view(q.shape[0], k).T
    return out


def check(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float]:
    """Within bf16 rounding of each output (2^-8 relative) plus 2^-12 of the largest; and the max error / max."""
    diff = (out.float() - ref).abs()
    top = ref.abs().max().item()
    ok = bool((diff <= TOLERANCE[0] * ref.abs() + TOLERANCE[1] * top + 1e-6).all()) and bool(torch.isfinite(out).all())
    return ok, diff.max().item() / max(top, 1e-30)


def _splits(blocks: int, warps: int, max_split: int, wide: bool) -> list[int]:
    """Split counts: the power of two s giving about WARPS_PER_SM resident warps per SM (at most max_split), and
    2 s too when `wide` (the first configs of a variant)."""
    want = SM_COUNT * WARPS_PER_SM / (warps * blocks)
    s = 1
    while s * 2 <= want and s * 2 <= max_split:
        s *= 2
    return [s, 2 * s] if wide and 2 * s <= max_split else [s]


def _sweep(base: list[Any], blocks: Callable[[Any], int], max_split: Callable[[Any], int], quick: bool,
           wide: int = 2) -> list[Any]:
    """Each base config at its split count(s): the first `wide` at two, the rest at one; --quick: the first only."""
    out = []
    for i, cfg in enumerate(base[:1] if quick else base):
        for sp in _splits(blocks(cfg), cfg.num_warps, max_split(cfg), i < wide and not quick):
            out.append(replace(cfg, split=sp))
    return out


@dataclass
class Variant:
    name: str
    run: Callable[[torch.Tensor, dict[str, Any], Any], torch.Tensor]
    configs: Callable[[int, int, dict[str, Any], bool], list[Any]]  # (n, k, op, quick) -> configs
    takes: Callable[[dict[str, Any], int], bool] = lambda op, k: True
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # one-time repack of a weight copy


def _rowpair_configs(n: int, k: int, op: dict[str, Any], quick: bool, tiny: bool = False) -> list[RowpairConfig]:
    if tiny:
        return [RowpairConfig(4), RowpairConfig(8, split=3, prefetch=False), RowpairConfig(16, 2, split=2),
                RowpairConfig(2, 1, reps=2, split=2)]
    kw = k * op["bits"] // 32
    base = [RowpairConfig(8), RowpairConfig(16), RowpairConfig(8, prefetch=False), RowpairConfig(4),
            RowpairConfig(8, 2), RowpairConfig(8, 4, prefetch=False)]
    return _sweep(base, lambda c: triton.cdiv(n, c.block_n), lambda c: triton.cdiv(kw, c.block_kw), quick)


def _kmajor_configs(n: int, k: int, op: dict[str, Any], quick: bool, tiny: bool = False) -> list[KmajorConfig]:
    if tiny:
        return [KmajorConfig(1, 8), KmajorConfig(2, 4, split=3), KmajorConfig(1, 16, split=2, cols_per_thread=8)]
    kw = k * op["bits"] // 32
    base = [KmajorConfig(4, 8), KmajorConfig(2, 8, cols_per_thread=8), KmajorConfig(4, 16), KmajorConfig(8, 8)]
    return _sweep(base, lambda c: triton.cdiv(n, c.block_n), lambda c: min(64, max(1, kw // c.rows)), quick, 1)


def _tc_configs(n: int, k: int, op: dict[str, Any], quick: bool, tiny: bool = False) -> list[TcConfig]:
    if tiny:
        return [TcConfig(16, 1), TcConfig(32, 4, split=2, prefetch=True), TcConfig(64, 4, split=3)]
    base = [TcConfig(128, 4), TcConfig(128, 4, prefetch=True), TcConfig(64, 4), TcConfig(128, 4, num_stages=3),
            TcConfig(256, 8)]
    return _sweep(base, lambda c: triton.cdiv(n, c.block_n), lambda c: min(32, k // 128), quick)


VARIANTS = [Variant("rowpair", rowpair_gemv, _rowpair_configs),
            Variant("kmajor", kmajor_gemv, _kmajor_configs, prepare=kmajor_repack),
            Variant("tc", tc_gemv, _tc_configs, takes=tc_takes)]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def _time(calls: list[Callable[[], Any]], args: argparse.Namespace) -> float | None:
    if args.tiny:
        return None
    from lamina.bench.gemv_sweep import _time_per_call

    return _time_per_call(calls, "cuda", args.warmup_ms, args.rep_ms)


def run_quant(name: str, n: int, k: int, qname: str, quant: tuple, x: torch.Tensor, args: argparse.Namespace,
              gen: torch.Generator, deadline: float) -> dict[str, Any]:
    from lamina.bench.quant_speed import quant_copy

    bits, gs, sym = quant
    first = quant_copy(n, k, bits, gs, sym, args.device, gen)
    count = 1 if args.tiny else max(2, math.ceil(args.rotate_mb * 2 ** 20 / first["bytes"]))
    ops = [first] + [quant_copy(n, k, bits, gs, sym, args.device, gen) for _ in range(count - 1)]
    order = [ops[i % count] for i in range(1 if args.tiny else max(count, 16))]
    ref = reference(x, first)
    row: dict[str, Any] = dict(bytes=first["bytes"], copies=count, variants={})

    def gbs(us: float | None) -> float | None:
        return None if us is None else first["bytes"] / us / 1e3

    if not args.tiny:  # the current kernel, default config
        from lamina.kernels.wna16_gemv import wna16_gemv

        def current(op: dict[str, Any]) -> torch.Tensor:
            return wna16_gemv(x, op["words"], op["scale"], op["zero"], None, op["bits"], op["group_size"])
        try:
            ok, err = check(current(first), ref)
            us = _time([lambda op=op: current(op) for op in order], args)
            row["current"] = dict(ok=ok, err=err, us=us, gbs=gbs(us))
        except Exception as exc:  # noqa: BLE001
            row["current"] = dict(ok=False, error=_error(exc))
    for var in VARIANTS:
        if args.variants and var.name not in args.variants:
            continue
        res: dict[str, Any] = {}
        row["variants"][var.name] = res
        if not var.takes(first, k):
            res["n/a"] = dict(ok=None, error=f"{var.name} does not take this weight (bits {bits}, group {gs}, K {k})")
            continue
        try:
            vops = [var.prepare(op) for op in ops] if var.prepare else ops
        except Exception as exc:  # noqa: BLE001
            res["prepare"] = dict(ok=False, error=_error(exc))
            continue
        vorder = [vops[i % count] for i in range(len(order))]
        cfgs = var.configs(n, k, first, args.quick, args.tiny) if args.tiny else var.configs(n, k, first, args.quick)
        for cfg in cfgs:
            if time.perf_counter() > deadline:
                res[cfg.name] = dict(ok=None, error="skipped: time budget")
                continue
            try:
                out = var.run(x, vops[0], cfg)
                ok, err = check(out, ref)
                entry: dict[str, Any] = dict(ok=ok, err=err)
                if ok:
                    us = _time([lambda op=op, c=cfg: var.run(x, op, c) for op in vorder], args)
                    entry.update(us=us, gbs=gbs(us))
                res[cfg.name] = entry
            except Exception as exc:  # noqa: BLE001 - compile error, out of resources, ...: record, keep going
                res[cfg.name] = dict(ok=False, error=_error(exc))
        if var.prepare:
            del vops
    del ops, order
    return row


def run_shape(name: str, n: int, k: int, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    import torch.nn.functional as F

    gen = torch.Generator(device=args.device).manual_seed(0)
    x = torch.randn(1, k, device=args.device, generator=gen).to(torch.bfloat16)
    row: dict[str, Any] = dict(shape=name, n=n, k=k, quants={})
    if not args.tiny:
        copies = max(2, math.ceil(args.rotate_mb * 2 ** 20 / (n * k * 2)))
        weights = [(torch.randn(n, k, device=args.device, generator=gen) / math.sqrt(k)).to(torch.bfloat16)
                   for _ in range(copies)]
        order = [weights[i % copies] for i in range(max(copies, 16))]
        row["cublas_us"] = _time([lambda w=w: F.linear(x, w) for w in order], args)
        row["cublas_gbs"] = n * k * 2 / row["cublas_us"] / 1e3
        del weights, order
    for qname, quant in (TINY_QUANTS if args.tiny else QUANTS).items():
        if args.quants and qname not in args.quants:
            continue
        row["quants"][qname] = run_quant(name, n, k, qname, quant, x, args, gen, deadline)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return row


def best(res: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    good = [(c, e) for c, e in res.items() if e.get("ok") and e.get("us") is not None]
    return min(good, key=lambda ce: ce[1]["us"]) if good else None


def table(rows: list[dict[str, Any]], tiny: bool) -> str:
    names = [v.name for v in VARIANTS]
    if tiny:
        lines = [f"{'shape':<8} {'quant':<9} " + " ".join(f"{v + ' ok/all':>14}" for v in names) + "  max err"]
        for row in rows:
            for q, r in row["quants"].items():
                cells, errs = [], []
                for v in names:
                    res = r["variants"].get(v, {})
                    runs = [e for e in res.values() if e.get("ok") is not None]
                    cells.append(f"{sum(bool(e['ok']) for e in runs)}/{len(runs)}" if runs else "n/a")
                    errs += [e["err"] for e in runs if "err" in e]
                lines.append(f"{row['shape']:<8} {q:<9} " + " ".join(f"{c:>14}" for c in cells)
                             + f"  {max(errs) if errs else float('nan'):.1e}")
        return "\n".join(lines)
    head = (f"{'shape':<8} {'q':<4} {'MB':>6} | {'cuBLAS':>7} | {'current':>7} {'GB/s':>5} | "
            + " | ".join(f"{v:>7} {'GB/s':>5} {'config':<22}" for v in names) + " | best: x current / x cuBLAS")
    lines = [head]
    for row in rows:
        for q, r in row["quants"].items():
            cur = r.get("current", {})
            cells, bests = [], []
            for v in names:
                res = r["variants"].get(v, {})
                b = best(res)
                if b:
                    bests.append(b[1]["us"])
                    cells.append(f"{b[1]['us']:>7.1f} {b[1]['gbs']:>5.0f} {b[0]:<22}")
                else:
                    cells.append(f"{'-':>7} {'':>5} {('n/a' if 'n/a' in res else '(none ok)'):<22}")
            speed = (f"{cur['us'] / min(bests):.2f}x / {row['cublas_us'] / min(bests):.2f}x"
                     if bests and cur.get("us") else "-")
            lines.append(f"{row['shape']:<8} {q:<4} {r['bytes'] / 1e6:>6.1f} | {row['cublas_us']:>7.1f} | "
                         f"{cur.get('us') or float('nan'):>7.1f} {cur.get('gbs') or float('nan'):>5.0f} | "
                         + " | ".join(cells) + f" | {speed}")
    return "\n".join(lines)


def failures(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for row in rows:
        for q, r in row["quants"].items():
            for v, res in r["variants"].items():
                for c, e in res.items():
                    if e.get("ok") is False:
                        why = e.get("error") or f"wrong answer, max error {e['err']:.2e} of the largest output"
                        out.append(f"{row['shape']}/{q}/{v}/{c}: {why}")
    return out


def sass_report(args: argparse.Namespace) -> int:
    """Compile each kernel for sm_90a ahead of time (no GPU needed: triton's bundled ptxas / cuobjdump) and print
    SASS instructions per int32 weight word in its main loop, registers and spills: the numbers the designs
    were chosen by."""
    import re
    import subprocess
    import tempfile
    from collections import Counter

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptr_types = {"x_ptr": "*i32", "w_ptr": "*i32", "wt_ptr": "*i32", "mt_ptr": "*i32", "s_ptr": "*bf16",
                 "z_ptr": "*i8", "out_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
    from lamina.kernels.wna16_gemv import _wna16_gemv_kernel

    rp4 = dict(BITS=4, XOR=0, GROUP_KW=16, HAS_ZERO=True, EVEN_K=True, BLOCK_KW=128)
    rp8 = dict(rp4, BITS=8, GROUP_KW=1 << 30, HAS_ZERO=False)
    tc = dict(GROUP_KW=16, HAS_ZERO=True, BLOCK_N=128, GMAX=16, IS_SPLIT=True)
    cases = [  # (label, kernel, constexprs, warps, stages, words per thread per main-loop iteration)
        ("current n4-kw512-w4", _wna16_gemv_kernel, dict(M=1, BITS=4, XOR=0, HAS_ZERO=True, HAS_BIAS=False,
                                                         EVEN_K=True, BLOCK_N=4, GROUPS=128, GROUP_W=4), 4, 1, 16),
        ("rowpair int4 n8-w1 pf", _rowpair_kernel, dict(rp4, BLOCK_N=8, IS_SPLIT=True, PREFETCH=True), 1, 1, 32),
        ("rowpair int4 n16-w1", _rowpair_kernel, dict(rp4, BLOCK_N=16, IS_SPLIT=False, PREFETCH=False), 1, 1, 64),
        ("rowpair int8 n8-w1", _rowpair_kernel, dict(rp8, BLOCK_N=8, IS_SPLIT=False, PREFETCH=False), 1, 1, 32),
        ("kmajor int4 c256-w1-r8", _kmajor_kernel, dict(BITS=4, XOR=0, GROUP_KW=16, ROWS=8, EVEN_N=True,
                                                        EVEN_K=True, BLOCK_N=256, IS_SPLIT=True), 1, 1, 64),
        ("tc int4 n128-w4", _tc_kernel, dict(tc, PREFETCH=False), 4, 1, 16),
        ("tc int4 n128-w4 pf", _tc_kernel, dict(tc, PREFETCH=True), 4, 1, 16),
    ]
    for label, fn, ce, warps, stages, words in cases:
        sig = {a: "constexpr" if a in ce else ptr_types.get(a, "i32") for a in fn.arg_names}
        if fn in (_tc_kernel, _wna16_gemv_kernel):  # x read as bf16
            sig.update(x_ptr="*bf16", **({"b_ptr": "*bf16"} if "b_ptr" in sig else {}))
        # as a launch specialises them: pointers, sizes and strides divisible by 16 (not the magic numbers)
        runtime = [a for a in fn.arg_names if a not in ce and a not in ("magic", "m16", "magic2", "split")]
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in runtime}
        try:
            src = ASTSource(fn=fn, signature=sig, constexprs=ce, attrs=attrs)
            comp = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps,
                                                                                     num_stages=stages))
            with tempfile.TemporaryDirectory() as d:
                path = Path(d) / "k.cubin"
                path.write_bytes(comp.asm["cubin"])
                sass = subprocess.run([bin_dir / "cuobjdump", "-sass", path], capture_output=True, text=True).stdout
                res = subprocess.run([bin_dir / "cuobjdump", "-res-usage", path], capture_output=True,
                                     text=True).stdout
        except Exception as exc:  # noqa: BLE001
            print(f"{label}: {_error(exc)}")
            continue
        ins = [(int(m.group(1), 16), m.group(2).strip()) for m in
               re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
        loops = []
        for addr, text in ins:
            body = re.sub(r"^@!?U?P\w+\s+", "", text)
            if body.startswith("BRA"):
                tgt = re.search(r"0x([0-9a-f]+)", body)
                if tgt and int(tgt.group(1), 16) < addr:
                    loops.append((int(tgt.group(1), 16), addr))
        def weight_loads(lh: tuple[int, int]) -> int:  # the K loop: the one with the evict-first weight loads
            return sum(1 for a, t in ins if lh[0] <= a <= lh[1] and "LDG.E.EF" in t)
        main = max(loops, key=lambda lh: (weight_loads(lh), lh[1] - lh[0])) if loops else (0, 0)
        body = [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for a, t in ins if main[0] <= a <= main[1]]
        regs = re.search(r"REG:(\d+)", res)
        stack = re.search(r"STACK:(\d+)", res)
        top = ", ".join(f"{o} {c}" for o, c in Counter(body).most_common(8))
        print(f"{label:<26} main loop {len(body):>4} instr / {words} words = {len(body) / words:5.1f} per word; "
              f"regs {regs and regs.group(1)}, stack {stack and stack.group(1)}; {top}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, the interpreter, tiny shapes: correctness only")
    parser.add_argument("--quick", action="store_true", help="one config family per variant")
    parser.add_argument("--sass", action="store_true", help="AOT-compile for sm_90a and count SASS (no GPU)")
    parser.add_argument("--variants", nargs="*", help=f"subset of {[v.name for v in VARIANTS]}")
    parser.add_argument("--quants", nargs="*", help="subset of int4 int8")
    parser.add_argument("--shapes", nargs="*", help=f"subset of {[s[0] for s in SHAPES]}")
    parser.add_argument("--budget-s", type=float, default=215.0, help="stop trying new configs after this long")
    parser.add_argument("--rotate-mb", type=float, default=256.0, help="weight copies per shape: at least this much")
    parser.add_argument("--warmup-ms", type=int, default=3)
    parser.add_argument("--rep-ms", type=int, default=15)
    args = parser.parse_args(argv)
    if args.sass:
        return sass_report(args)
    global SM_COUNT
    args.device = "cpu" if args.tiny else "cuda"
    if not args.tiny:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: use --tiny (interpreter) or --sass")
        SM_COUNT = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = TINY_SHAPES if args.tiny else [s for s in SHAPES if not args.shapes or s[0] in args.shapes]
    out_dir = Path(os.environ.get("OUT") or "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    deadline = start + (float("inf") if args.tiny else args.budget_s)
    report: dict[str, Any] = dict(workload="wna16-gemv-variants", tiny=args.tiny, command=" ".join(sys.argv),
                                  date=time.strftime("%Y-%m-%d %H:%M:%S"), torch=torch.__version__,
                                  triton=triton.__version__,
                                  device=torch.cuda.get_device_name() if not args.tiny else "cpu (interpreter)",
                                  rows=[])
    for name, n, k in shapes:
        report["rows"].append(run_shape(name, n, k, args, deadline))
        report["seconds"] = time.perf_counter() - start
        (out_dir / "gemv-variants.json").write_text(json.dumps(report, indent=1))
        print(f"{name}: done at {report['seconds']:.0f} s", flush=True)
    fails = failures(report["rows"])
    for line in fails:
        print("FAILED", line)
    print(table(report["rows"], args.tiny))
    if args.tiny:
        print("(interpreter on CPU: correctness only)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

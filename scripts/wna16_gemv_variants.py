"""Alternative W4A16 / W8A16 GEMV kernels for one row of x (decode, issue #13), checked and timed on the GPU.

    python scripts/wna16_gemv_variants.py              # CUDA: sweep every variant on the Llama-3-8B shapes (~3-4 min)
    python scripts/wna16_gemv_variants.py --quick      # CUDA: fewer configs
    python scripts/wna16_gemv_variants.py --tiny       # any machine: every variant through the interpreter (CPU)
    python scripts/wna16_gemv_variants.py --sass       # any machine: compile for sm_90a ahead of time, count SASS

Why the current kernel (lamina/kernels/wna16_gemv.py) is slow
--------------------------------------------------------------
At one row the GEMV should be a pure weight stream (H200: ~4.6 TB/s), but sm_90 SASS of its default config
(n4-kw512-w4, compiled ahead of time with `--sass`) has ~870 instructions in its K loop for 16 words a thread:
~54 per int32 word (8 weights). At ~1.1e12 words/s (the HBM rate) that is 2x what the SMs can issue; measured
1.1-1.5 TB/s. The instructions go to: a shared-memory layout conversion of x every tile (STS/LDS/BAR), an integer
division for the group index, FADD per weight (exact 2^23-magic unpack) on top of the LOP3 and FFMA, and per-word
x splits. So the variants below are designed by instruction count per word, read off the SASS (`--sass`):

Variants (each a Triton kernel below with a docstring; no inline assembly, so all run in the interpreter)
---------------------------------------------------------------------------------------------------------
rowpair   Native layout (no repack). A program owns BLOCK_N rows; every row is its own 1-D tensor over the tile's
          words (Python-unrolled: tuples of per-row accumulators), so x's tile, the weight tiles and the scale /
          zero-point loads all get the same register layout: thread t owns the 4 consecutive words 4t..4t+3 of
          each row (one 16-byte load per row) and the matching 64 bytes of x (four 16-byte loads). No layout
          conversion, no shared memory in the K loop. Unpack: "pair" trick, two nibbles per LOP3:
              t  = ((w >> 4j) & 0x000F000F) | 0x43000000      bits(t)        = 128 + u[j + 4] (+ u[j] * 2^-16)
              t2 = t * 65536 + 0x43000000  (one IMAD)          bits(t2)       = 128 + u[j]      exactly
          then one FFMA per weight against x (bf16 -> fp32 once per tile, shared by the BLOCK_N rows):
          per word 3 SHF + 4 LOP3 + 4 IMAD + 8 FFMA = 19 instructions (IMAD on the FMA pipe, not the ALU pipe).
          The 128 bias (and the 8 + zero point) is removed once per 4-word chunk and row: s * (sum - (136 + z) *
          sum x); the 2^-16 leak of the low nibble into the high value is ~1e-5 relative (bf16's ulp: 4e-3).
          The K range can be split over SPLIT programs (a runtime argument): fp32 partials, an atomic counter per
          row block, the last program to arrive sums the partials in split order (deterministic) and resets the
          counter: one launch, capturable in a CUDA graph. Optional register prefetch of the next weight tile.
          int8 (W8A16, per channel): one byte into bits 8..15 of 2^15 (0x47000000): 32768 + u, 1-2 ops a value.
          Expect ~24-26 SASS instructions per word (BLOCK_N 8-16) against ~54 now: ~2x at 1 row.
kmajor    GemLite-style K-major repack (one-time, at load): words [K/8, N], scales / zero points [groups, N].
          Lanes run along N (4 consecutive output columns per thread: one 16-byte load per K word-row), each
          thread walks a contiguous K range, so the sums stay in registers with no cross-lane reduction at all;
          x's 8 values of a word-row are warp-uniform scalar loads. Same pair unpack and bias algebra as rowpair.
          Programs (N / BLOCK_N, SPLIT): SPLIT splits K (same semaphore reduction). Expect ~24 per word; it
          trades rowpair's per-row lane reductions for x loads per word-row.
tc        Tensor cores (wgmma / mma through tl.dot): the weight is the left operand (rows of W as the MMA's M,
          "swap AB"), x the right one padded to 16 columns. Unpack as bf16 pairs, Marlin style, straight into
          the MMA's operand: ((w >> 4j) & 0x000F000F) | 0x43004300 = bf16x2(128 + u[j], 128 + u[j + 4]): one SHF
          and one LOP3 per two weights, no FFMA at all (the products are exact in the MMA, fp32 accumulation).
          K is permuted inside each word (pairs (j, j + 4) adjacent) and x is loaded in the same permuted order,
          so no reordering joins are needed. The 128 + 8 + z bias is removed per group from the fp32 result.
          Triton stages the operand through shared memory (its dot-operand path), so expect ~12-16 per word;
          included to see whether a 1-row tensor-core GEMV wins on the H200.

Check: every config's output against an fp32 reference (w = (q - z) * s in fp32, x @ w.T in fp32), max error
<= 2^-8 of the largest output (bf16 rounding is 2^-9; the kernels' own error is ~1e-5). Timing: CUDA graphs of
calls rotating weight copies through > 256 MB (lamina.bench.gemv_sweep._time_per_call, do_bench median), as
lamina.bench.quant_speed times the current kernel; a config that fails (compile error, out of resources, wrong
answer) is recorded and skipped. JSON to $OUT/gemv-variants.json ($OUT default ./out).

Integration notes: rowpair reads the checkpoint's layout as is (x must be contiguous: it is read as int32 pairs);
kmajor needs `kmajor_repack` once at load time (words, scale, zero point transposed); tc reads the native layout.
Split-K configs keep a per-(device, N, split) fp32 workspace and an int32 counter array that must start zeroed
(the kernel leaves it zeroed): one stream at a time per workspace.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
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
TOLERANCE = 2 ** -8  # max |out - ref| / max |ref|


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


@triton.jit
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
    32896 at 8: the magic bias plus the storage offset). Same bytes streamed per call as the native format."""
    bits, scale, zero = op["bits"], op["scale"], op["zero"]
    zb = (136 if bits == 4 else 32896) + (0 if zero is None else zero.to(torch.int32))
    sbits = scale.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    meta = ((sbits << 16) | (zb & 0xFFFF)).to(torch.int32)  # int32 arithmetic wraps: the bits are what count
    if meta.dim() == 1:
        meta = meta[:, None]
    return dict(op, words_t=op["words"].t().contiguous(), meta_t=meta.t().contiguous())


@triton.jit
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
    assert x.shape[0] == 1 and x.is_contiguous() and k == kw * (32 // bits)
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

"""Register arithmetic of the weight-only GEMV (lamina/kernels/wna16_row.py): packed weight words and x's bf16
pairs into float32 values, and their sums over a 4-word chunk for 1..4 rows of x. Every function works on
tensors whose values a thread holds itself (no shuffles, no shared memory).

x is read as int32 pairs of bf16 (x[2i] in bits 0..15, x[2i + 1] in bits 16..31): `lo` / `hi` take one out in one
op. int4 unpacks two nibbles per LOP3 ("pair" trick; 128.0's bits and 65536 are kernel arguments, so they sit in
registers: one LOP3, and the shift-add is an IMAD on the FMA pipe):

    t  = ((w >> 4j) & 0x000F000F) | 0x43000000      float bits = 128 + u[j+4] + u[j] * 2^-16
    t2 = t * 65536 + 0x43000000                     float bits = 128 + u[j]   (exact)

then one FFMA per weight (t's u[j] * 2^-16 leak is ~1e-5 of an output; a bf16 ulp is 4e-3). int8: a byte into
bits 8..15 of 32768.0 reads as 32768 + u, one PRMT (byte permute) a byte: PTX inline assembly, so only when
compiled; the interpreter takes a shift and a LOP3.

With M rows of x each word is unpacked once and its floats multiplied into every row (`dot_words`). Importing
this module imports triton.
"""
from __future__ import annotations

import triton
import triton.language as tl

MAGIC4 = 0x43000000  # float32 128.0: a nibble at bits 16..19 reads as 128 + u
MAGIC8 = 0x47000000  # float32 32768.0: a byte at bits 8..15 reads as 32768 + u


@triton.jit
def i2f(v):
    """float(v) for integers |v| < 2^22: one IADD and one FADD (I2F issues at a quarter of the FP32 rate)."""
    return (v + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def lo(p):
    """The low bf16 of an int32 bf16 pair, as float32: one op."""
    return (p << 16).to(tl.float32, bitcast=True)


@triton.jit
def hi(p):
    """The high bf16 of an int32 bf16 pair, as float32: one op."""
    return (p & -65536).to(tl.float32, bitcast=True)


@triton.jit
def unzip(t, A: tl.constexpr, B: tl.constexpr):
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
def columns4(v, A: tl.constexpr):
    """[A, 4] -> its 4 columns [A] as a tuple."""
    return unzip(unzip((v,), A, 2), A, 1)


@triton.jit
def int4_floats(w, magic, m16):
    """The 8 nibbles u of each word w as floats 128 + u, in the order (u_4, u_0, u_5, u_1, u_6, u_2, u_7, u_3):
    3 SHF, 4 LOP3 (mask | magic), 4 IMAD (m16 = 65536 in a register: not a LEA). t's own float is
    128 + u[j+4] + u[j] * 2^-16 (the module docstring)."""
    out = ()
    for j in tl.static_range(4):
        t = ((w >> 4 * j) & 0x000F000F) | magic
        out = out + (t.to(tl.float32, bitcast=True), (t * m16 + magic).to(tl.float32, bitcast=True))
    return out


@triton.jit
def byte_float(w, magic8, J: tl.constexpr):
    """32768 + byte J of w as float32, in one PRMT: selector 0x75J4 takes magic8's byte 0, w's byte J, then
    magic8's bytes 1 and 3 (bytes 4..7 of the pair are magic8's)."""
    if J == 0:
        asm: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7504;"
    elif J == 1:
        asm: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7514;"
    elif J == 2:
        asm: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7524;"
    else:
        asm: tl.constexpr = "prmt.b32 $0, $1, $2, 0x7534;"
    return tl.inline_asm_elementwise(asm, "=r,r,r", [w, magic8], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def int8_floats(w, magic8, PRMT: tl.constexpr):
    """The 4 bytes u of each word w as floats 32768 + u, in order: one PRMT a byte when compiled (PRMT), a shift
    and a LOP3 under the interpreter (no inline assembly there)."""
    if PRMT:
        return (byte_float(w, magic8, 0), byte_float(w, magic8, 1), byte_float(w, magic8, 2),
                byte_float(w, magic8, 3))
    return ((((w << 8) & 0xFF00) | magic8).to(tl.float32, bitcast=True),
            ((w & 0xFF00) | magic8).to(tl.float32, bitcast=True),
            (((w >> 8) & 0xFF00) | magic8).to(tl.float32, bitcast=True),
            (((w >> 16) & 0xFF00) | magic8).to(tl.float32, bitcast=True))


@triton.jit
def load_x(x_ptr, stride_xm, kw0, KW, x_offs, offs_c, C: tl.constexpr, M: tl.constexpr, PAIRS: tl.constexpr,
            EVEN_K: tl.constexpr):
    """x's bf16 pairs for the tile's chunks, row after row: item m * 4 * PAIRS + q is pair q of the chunk's 4 words
    (q = PAIRS * word + pair) in row m; and each row's sum over the chunk's values (a tuple of M)."""
    xq = ()
    xs = ()
    for m in tl.static_range(M):
        xb = x_ptr + m * stride_xm + kw0 * PAIRS + x_offs
        total = tl.zeros([C], dtype=tl.float32)
        for i in tl.static_range(PAIRS):
            if EVEN_K:
                xp = tl.load(xb + 4 * i)
            else:
                xp = tl.load(xb + 4 * i, mask=(kw0 + offs_c * 4 + (4 * i) // PAIRS)[:, None]
                             + tl.arange(0, 4)[None, :] // PAIRS < KW, other=0)
            pairs = columns4(xp, C)
            for q in tl.static_range(4):
                total += lo(pairs[q]) + hi(pairs[q])
            xq = xq + pairs
        xs = xs + (total,)
    return xq, xs


@triton.jit
def x_value(xq, base: tl.constexpr, i: tl.constexpr):
    """x value i of the word whose bf16 pairs start at xq[base], as float32: the low half of pair i // 2 when i
    is even, the high half when odd."""
    if i % 2 == 0:
        return lo(xq[base + i // 2])
    return hi(xq[base + i // 2])


@triton.jit
def dot_words(wq, xq, magic, m16, C: tl.constexpr, M: tl.constexpr, BITS: tl.constexpr, PRMT: tl.constexpr):
    """sum_k (BASE + u[k]) x[m, k] over the chunk's 4 words wq (a tuple) for each row m of x: each word unpacked
    once, its floats multiplied into every row (a tuple of M)."""
    PAIRS: tl.constexpr = 16 // BITS
    parts = ()
    for m in tl.static_range(M):
        parts = parts + (tl.zeros([C], dtype=tl.float32),)
    for v in tl.static_range(4):
        if BITS == 4:
            floats = int4_floats(wq[v], magic, m16)
        else:
            floats = int8_floats(wq[v], magic, PRMT)
        new = ()
        for m in tl.static_range(M):
            part = parts[m]
            for e in tl.static_range(2 * PAIRS):
                # word v's pairs start at xq[m * 4 * PAIRS + PAIRS * v] (load_x's order), written out per width;
                # x value i of the word multiplies float e: int4 i = 4 + e // 2 (e even) or e // 2; int8 i = e
                if BITS == 4:
                    part += floats[e] * x_value(xq, m * 16 + 4 * v, e // 2 + 4 * (1 - e % 2))
                else:
                    part += floats[e] * x_value(xq, m * 8 + 2 * v, e)
            new = new + (part,)
        parts = new
    return parts

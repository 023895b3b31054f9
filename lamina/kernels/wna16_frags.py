"""Tensor-core fragments of the weight-only GEMV (lamina/kernels/wna16_tc.py), made in registers: no shared memory.

One `mma.sync.m16n8k16` (bf16 in, fp32 out) multiplies a 16-row tile of the weight by 16 K values of up to 8 rows
of x. Its A fragment in lane L = 4 g + t is A[g | g + 8][2t, 2t + 1 | 2t + 8, 2t + 9], its B fragment B[2t, 2t + 1
| 2t + 8, 2t + 9][g] (x's row g), its output D[g | g + 8][2t, 2t + 1]. The MMA's k order is ours to choose as
long as A and B agree, so each lane reads whole words of the checkpoint's layout: lane (g, t) holds word kw of
weight rows g and g + 8 ("wa" and "wb"). int4: the 8 nibbles of a word feed two k steps,

    step s:  A regs  ((wa >> 8s) & 0x000F000F) | 128.0 pair,  the same of wb,  then of wa >> 8s + 4,  wb >> 8s + 4
             B regs  (x[2s], x[2s + 4]),  (x[2s + 1], x[2s + 5])           x[e]: x at the word's value e

the A regs being the bf16 pairs 128 + u (exact: one LOP3 per two values, after one SHF); int8: the 4 bytes of a
word feed one k step, A regs (q0, q1) and (q2, q3) of wa and wb (q = u - 128 exact in bf16: each byte into
2^23's low byte with a PRMT, minus 2^23 + 128, two floats' high halves paired with a PRMT), B regs x's own pairs
(x[0], x[1]), (x[2], x[3]). So a step's k index 2t + e' + 8j' is one value of the word in lane t, the same in
rows g and g + 8 and in x.

`mma_chain` chains the 4 words a lane holds of one row pair (a 16-byte load) through the MMAs, so the 4 lanes of
a row pair sum a chunk of 16 words (128 values at int4, 64 at int8: inside one quantization group); its 4 fp32
outputs are D's four values in the lane, returned in the 4 slots of the words (pack 4): slot j is row g (j < 2)
or g + 8, x's row 2t + j % 2. `x_sums` is the same chain with A all ones: x's sums over the chunk, in the same
slots, to take off what the A values carry beyond q - z: D - zb * sums.

Under the Triton interpreter there is no inline assembly: the functions take the lane dimensions as tensor
dimensions ([8 g, tiles, chunks, 16 = 4 t + j]) and compute the same sums with tensor ops (the tests' oracle of
the kernel's index arithmetic: tests/kernels/test_wna16_tc.py). The assembly itself is checked on the GPU
(scripts/wna16_gemv_variants.py checks every config it times against an fp32 reference) and assembled for sm_90
ahead of time by tests/kernels/test_kernels_compile_for_hopper.py. Importing this module imports triton.
"""
from __future__ import annotations

import triton
import triton.language as tl

_MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d0, d1, d2, d3}, {%s}, {%s}, {d0, d1, d2, d3};\n"
_NIBBLES = "lop3.b32 %s, %s, 0x000F000F, 0x43004300, 0xEA;\n"  # (w & 0x000F000F) | 0x43004300: bf16 128 + u pair


def _int4_word(j: int, b: int, lines: list[str]) -> None:
    """Two k steps of the words $4+j (row g) and $8+j (row g + 8): nibbles (2s, 2s + 4) and (2s + 1, 2s + 5)."""
    wa, wb = f"${4 + j}", f"${8 + j}"
    for s in range(2):
        for reg, word, shift in (("a0", wa, 8 * s), ("a1", wb, 8 * s), ("a2", wa, 8 * s + 4), ("a3", wb, 8 * s + 4)):
            src = word
            if shift:
                src = "sa" if word == wa else "sb"
                lines.append(f"shr.u32 {src}, {word}, {shift};\n")
            lines.append(_NIBBLES % (reg, src))
        lines.append(_MMA % ("a0, a1, a2, a3", f"${b + 8 * s + j}, ${b + 8 * s + 4 + j}"))


def _int8_word(j: int, b: int, lines: list[str]) -> None:
    """One k step of the words $4+j (row g) and $8+j (row g + 8): each byte into 2^23's low byte (PRMT), minus
    2^23 + 128 (the signed value, exact), two floats' high halves to a bf16 pair (PRMT: exact, small integers)."""
    for word, lo, hi in ((f"${4 + j}", "a0", "a2"), (f"${8 + j}", "a1", "a3")):
        for e in range(4):
            lines.append(f"prmt.b32 f{e}, {word}, 0x4B000000, 0x754{e};\nsub.f32 f{e}, f{e}, 0f4B000080;\n")
        lines.append(f"prmt.b32 {lo}, f0, f1, 0x7632;\nprmt.b32 {hi}, f2, f3, 0x7632;\n")
    lines.append(_MMA % ("a0, a1, a2, a3", f"${b + j}, ${b + 4 + j}"))


def _chain_asm(bits: int, ones: bool) -> str:
    """PTX of a pack of 4 words: outputs $0..$3; inputs (4 registers each) wa, wb (absent when `ones`) and the B
    registers (int4: b0 b1 step 0, b2 b3 step 1; int8: b0 b1)."""
    b = 4 if ones else 12  # first B operand
    lines = ["{\n.reg .b32 a0, a1, a2, a3, sa, sb;\n.reg .f32 d0, d1, d2, d3, f0, f1, f2, f3;\n",
             "mov.b32 d0, 0;\nmov.b32 d1, 0;\nmov.b32 d2, 0;\nmov.b32 d3, 0;\n"]
    if ones:
        lines.append("mov.b32 a0, 0x3F803F80;\n")  # bf16 (1, 1)
    for j in range(4):
        if ones:
            for s in range(2 if bits == 4 else 1):
                lines.append(_MMA % ("a0, a0, a0, a0", f"${b + 8 * s + j}, ${b + 8 * s + 4 + j}"))
        elif bits == 4:
            _int4_word(j, b, lines)
        else:
            _int8_word(j, b, lines)
    lines.append("mov.b32 $0, d0;\nmov.b32 $1, d1;\nmov.b32 $2, d2;\nmov.b32 $3, d3;\n}")
    return "".join(lines)


INT4_CHAIN_ASM = tl.constexpr(_chain_asm(4, False))
INT8_CHAIN_ASM = tl.constexpr(_chain_asm(8, False))
INT4_SUMS_ASM = tl.constexpr(_chain_asm(4, True))
INT8_SUMS_ASM = tl.constexpr(_chain_asm(8, True))
X4_FRAGS_ASM = tl.constexpr("{\n.reg .b32 p0, p1, p2, p3;\nld.global.nc.v4.b32 {p0, p1, p2, p3}, [$4];\n"
                            "prmt.b32 $0, p0, p2, 0x5410;\nprmt.b32 $1, p0, p2, 0x7632;\n"
                            "prmt.b32 $2, p1, p3, 0x5410;\nprmt.b32 $3, p1, p3, 0x7632;\n}")
X8_FRAGS_ASM = tl.constexpr("ld.global.nc.v2.b32 {$0, $1}, [$2];")
# Loads of one value into a float32 ($0) from an address ($1); predicated stores ($1 address, $2 value, $3 mask)
LOAD_BF16 = tl.constexpr("{ .reg .b16 h; ld.global.nc.b16 h, [$1]; cvt.f32.bf16 $0, h; }")
LOAD_I8 = tl.constexpr("{ .reg .s32 v; ld.global.nc.s8 v, [$1]; cvt.rn.f32.s32 $0, v; }")
LOAD_F32 = tl.constexpr("ld.global.cg.f32 $0, [$1];")
STORE_BF16 = tl.constexpr("{ .reg .pred p; .reg .b16 h; setp.ne.b32 p, $3, 0; cvt.rn.bf16.f32 h, $2; "
                          "@p st.global.b16 [$1], h; mov.b32 $0, 0; }")
STORE_F32 = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.f32 [$1], $2; mov.b32 $0, 0; }")


@triton.jit
def load_f32(ptrs, COMPILED: tl.constexpr):
    """*ptrs (bf16, int8 or fp32; in bounds) as float32. Compiled: inline assembly, so that the loads of the
    scales, zero points, bias and split-K partials take the layout of their users (a tl.load's own layout, chosen
    for its addresses, would pull the K loop's sums into it through a layout conversion every step); fp32 loads
    go through L2 (.cg: other programs' split-K partials) and keep their place after the atomic before them."""
    if not COMPILED:
        return tl.load(ptrs).to(tl.float32)
    addr = ptrs.to(tl.int64, bitcast=True)
    if ptrs.dtype.element_ty == tl.bfloat16:
        return tl.inline_asm_elementwise(LOAD_BF16, "=f,l", [addr], dtype=tl.float32, is_pure=True, pack=1)
    if ptrs.dtype.element_ty == tl.int8:
        return tl.inline_asm_elementwise(LOAD_I8, "=f,l", [addr], dtype=tl.float32, is_pure=True, pack=1)
    return tl.inline_asm_elementwise(LOAD_F32, "=f,l", [addr], dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def store_f32(ptrs, value, mask, COMPILED: tl.constexpr):
    """*ptrs = value (float32) as ptrs' dtype (bf16: rounded to nearest, or fp32) where mask; inline assembly
    when compiled (load_f32 says why)."""
    if not COMPILED:
        tl.store(ptrs, value.to(ptrs.dtype.element_ty), mask=mask)
    else:
        addr = ptrs.to(tl.int64, bitcast=True)
        if ptrs.dtype.element_ty == tl.bfloat16:
            tl.inline_asm_elementwise(STORE_BF16, "=r,l,f,r", [addr, value, mask.to(tl.int32)], dtype=tl.int32,
                                      is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise(STORE_F32, "=r,l,f,r", [addr, value, mask.to(tl.int32)], dtype=tl.int32,
                                      is_pure=False, pack=1)


@triton.jit
def x_frags(x_ptr, offs, BITS: tl.constexpr, COMPILED: tl.constexpr):
    """The B registers of the words whose x values start at int32-pair offsets `offs` of x: int4 (8 values, 16
    bytes) (x[0], x[4]), (x[1], x[5]), (x[2], x[6]), (x[3], x[7]), low half first; int8 (4 values) x's own pairs
    (x[0], x[1]), (x[2], x[3]). Compiled: one 16- / 8-byte load (and 4 PRMTs at int4) in inline assembly, so the
    result takes the layout of its users (the weights' lanes; load_f32 says why)."""
    if BITS == 8:
        return _x8_frags(x_ptr, offs, COMPILED)
    else:
        return _x4_frags(x_ptr, offs, COMPILED)


@triton.jit
def _x4_frags(x_ptr, offs, COMPILED: tl.constexpr):
    if COMPILED:
        return tl.inline_asm_elementwise(X4_FRAGS_ASM, "=r,=r,=r,=r,l", [(x_ptr + offs).to(tl.int64, bitcast=True)],
                                         dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        p0 = tl.load(x_ptr + offs)
        p1 = tl.load(x_ptr + offs + 1)
        p2 = tl.load(x_ptr + offs + 2)
        p3 = tl.load(x_ptr + offs + 3)
        return ((p0 & 0xFFFF) | (p2 << 16), ((p0 >> 16) & 0xFFFF) | (p2 & -65536),
                (p1 & 0xFFFF) | (p3 << 16), ((p1 >> 16) & 0xFFFF) | (p3 & -65536))


@triton.jit
def _x8_frags(x_ptr, offs, COMPILED: tl.constexpr):
    if COMPILED:
        return tl.inline_asm_elementwise(X8_FRAGS_ASM, "=r,=r,l", [(x_ptr + offs).to(tl.int64, bitcast=True)],
                                         dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        return tl.load(x_ptr + offs), tl.load(x_ptr + offs + 1)


@triton.jit
def _half(b, HIGH: tl.constexpr):
    """The low or high bf16 of int32 pairs, as float32."""
    if HIGH:
        return (b & -65536).to(tl.float32, bitcast=True)
    return (b << 16).to(tl.float32, bitcast=True)


@triton.jit
def _x_values(frags, BITS: tl.constexpr):
    """x at each value of the words (float32), from their B registers: e = 0..7 (int4) or 0..3 (int8)."""
    if BITS == 8:
        return _half(frags[0], False), _half(frags[0], True), _half(frags[1], False), _half(frags[1], True)
    else:
        return (_half(frags[0], False), _half(frags[1], False), _half(frags[2], False), _half(frags[3], False),
                _half(frags[0], True), _half(frags[1], True), _half(frags[2], True), _half(frags[3], True))


@triton.jit
def _word_value(w, e: tl.constexpr, BITS: tl.constexpr):
    """Value e of words w as the A registers hold it: 128 + u (int4), u - 128 (int8), float32."""
    if BITS == 4:
        return (128 + ((w >> 4 * e) & 15)).to(tl.float32)
    return (((w >> 8 * e) & 255) - 128).to(tl.float32)


@triton.jit
def _to_slots(q, CH: tl.constexpr):
    """q [G, T, CH, 8] (x's row n last) -> [G, T, CH, 16]: slot 4 t + j holds q[..., 2t + j % 2]."""
    tj = tl.arange(0, 16)
    pick = (tl.arange(0, 8)[None, :] == 2 * (tj[:, None] // 4) + tj[:, None] % 2).to(tl.float32)
    return tl.sum(q[:, :, :, None, :] * pick[None, None, None, :, :], axis=4)


@triton.jit
def _emulated_chain(wa, wb, frags, BITS: tl.constexpr, T: tl.constexpr, CH: tl.constexpr):
    """mma_chain's sums with tensor ops (lanes as dimensions: [8 g, T, CH, 16 t j]; frags [8 n, 1, CH, 16])."""
    xv = _x_values(frags, BITS)
    qa = tl.zeros([8, T, CH, 16, 8], dtype=tl.float32)
    qb = tl.zeros([8, T, CH, 16, 8], dtype=tl.float32)
    for e in tl.static_range(32 // BITS):
        xe = tl.permute(tl.broadcast_to(xv[e], (8, 1, CH, 16)), (1, 2, 3, 0))[None]  # [1, 1, CH, 16, 8 n]
        qa += _word_value(wa, e, BITS)[:, :, :, :, None] * xe
        qb += _word_value(wb, e, BITS)[:, :, :, :, None] * xe
    slot = tl.arange(0, 16)[None, None, None, :] % 4
    return tl.where(slot < 2, _to_slots(tl.sum(qa, axis=3), CH), _to_slots(tl.sum(qb, axis=3), CH))


@triton.jit
def mma_chain(wa, wb, frags, BITS: tl.constexpr, T: tl.constexpr, CH: tl.constexpr, COMPILED: tl.constexpr):
    """D = sum over the chunk's 16 words of value * x (128 + u at int4, the signed value at int8) for weight rows
    g, g + 8 and x's rows 2t, 2t + 1, in the words' slots (the module docstring). wa, wb [8, T, CH, 16] int32
    words; frags: x_frags of the same words."""
    if not COMPILED:
        return _emulated_chain(wa, wb, frags, BITS, T, CH)
    elif BITS == 4:
        return tl.inline_asm_elementwise(INT4_CHAIN_ASM, "=f,=f,=f,=f" + ",r" * 24,
                                         [wa, wb, frags[0], frags[1], frags[2], frags[3]], dtype=tl.float32,
                                         is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(INT8_CHAIN_ASM, "=f,=f,=f,=f" + ",r" * 16, [wa, wb, frags[0], frags[1]],
                                         dtype=tl.float32, is_pure=True, pack=4)


@triton.jit
def x_sums(frags, BITS: tl.constexpr, CH: tl.constexpr, COMPILED: tl.constexpr):
    """x's sums over the chunk's 16 words for x's rows 2t + j % 2, in the words' slots ([8, 1, CH, 16])."""
    if COMPILED:
        if BITS == 4:
            return tl.inline_asm_elementwise(INT4_SUMS_ASM, "=f,=f,=f,=f" + ",r" * 16,
                                             [frags[0], frags[1], frags[2], frags[3]], dtype=tl.float32,
                                             is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(INT8_SUMS_ASM, "=f,=f,=f,=f" + ",r" * 8, [frags[0], frags[1]],
                                             dtype=tl.float32, is_pure=True, pack=4)
    xv = _x_values(frags, BITS)
    tot = tl.zeros([8, 1, CH, 16], dtype=tl.float32)
    for e in tl.static_range(32 // BITS):
        tot += xv[e]
    sums = tl.permute(tl.sum(tot, axis=3), (1, 2, 0))[:, None, :, :]  # [1, 1, CH, 8 n]
    return tl.broadcast_to(_to_slots(sums, CH), (8, 1, CH, 16))

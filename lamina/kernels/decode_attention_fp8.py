"""Paged decode attention over an fp8 (e4m3) cache with 16-bit queries: lamina.kernels.decode_attention's grid,
rows, splits and partials, with K and V read as int32 words.

Read as e4m3 elements, Triton moves each tile into the tensor cores' operand layout byte by byte (shared-memory
gathers and byte packing before the conversion: 178 warp-instructions per KB of K/V in the main loop against
the bf16 kernel's 69, `scripts/decode_attention_sass.py`), and the kernel ran at half the bf16 one's bytes per
second. Here each thread loads whole words, converts them in registers, and the dots take the four byte
positions of a word apart, so every operand is already 16-bit:

    word w of a row = e4m3 elements 4w .. 4w + 3  (bytes 0..3)    W = head_dim / 4 words
    q . k  = sum_j  q[:, j::4] . k_j^T            k_j [BLOCK_N, W]: byte j of every word, fp16
    acc_j  = sum_n  p[:, n] v_j[n, :]             acc_j [BLOCK_M, W] = out[:, j::4]

On a GPU one PTX sequence converts two words into the four byte positions (4 cvt.rn.f16x2.e4m3x2 and 4 prmt:
115 instructions per KB); under the interpreter (CPU tensors, the tests) the same bytes are taken by shifts.
k_scale is folded into the score scale and v_scale into the output, as in the 16-bit-element kernel. Needs
head_dim a power of two >= 64 (a dot's inner size is W >= 16). Importing this module imports triton.
"""
from __future__ import annotations

import triton
import triton.language as tl

from lamina.kernels.prefill_attention import paged_kv_offsets

FP16_MAX = tl.constexpr(65504.0)


def takes(head_dim: int, block_d: int) -> bool:
    """Whether this kernel takes a cache row of head_dim elements (padded to block_d)."""
    return head_dim == block_d and head_dim >= 64


@triton.jit
def _byte(w, j: tl.constexpr):
    """Byte j of each int32 word, an e4m3 value, as fp16."""
    return ((w >> (8 * j)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _bytes(w, ASM: tl.constexpr):
    """The four byte positions of int32 words of e4m3 values, as four fp16 tensors of w's shape."""
    if ASM:  # two words a call: each output register holds one byte position of both (f16x2)
        return tl.inline_asm_elementwise(
            asm="{ .reg .b16 a0, a1, c0, c1; .reg .b32 A, B, C, D; "
                "mov.b32 {a0, a1}, $4; mov.b32 {c0, c1}, $5; "
                "cvt.rn.f16x2.e4m3x2 A, a0; cvt.rn.f16x2.e4m3x2 B, a1; "
                "cvt.rn.f16x2.e4m3x2 C, c0; cvt.rn.f16x2.e4m3x2 D, c1; "
                "prmt.b32 $0, A, C, 0x5410; prmt.b32 $1, A, C, 0x7632; "
                "prmt.b32 $2, B, D, 0x5410; prmt.b32 $3, B, D, 0x7632; }",
            constraints="=r,=r,=r,=r,r,r", args=[w], dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
            is_pure=True, pack=2)
    return _byte(w, 0), _byte(w, 1), _byte(w, 2), _byte(w, 3)


@triton.jit
def _query(q_base, j: tl.constexpr, row_ok):
    """Query columns j::4 in fp16 (a query past fp16's range clamped into it, not made inf)."""
    q = tl.load(q_base + j, mask=row_ok[:, None], other=0.0).to(tl.float32)
    return tl.minimum(tl.maximum(q, -FP16_MAX), FP16_MAX).to(tl.float16)


@triton.jit
def _store(base, j: tl.constexpr, acc, mask):
    tl.store(base + j, acc.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _tile(k_words, v_words, table_ptr, start, hi, kv_head_off, stride_cb, stride_cs, cols,
          BLOCK_N: tl.constexpr, PAGE: tl.constexpr):
    """Key positions start .. start + BLOCK_N and their K and V words (zeros past hi: nothing is read there)."""
    pos, off = paged_kv_offsets(table_ptr, start, hi, kv_head_off, stride_cb, stride_cs, BLOCK_N, PAGE)
    words = (off // 4)[:, None] + (cols // 4)[None, :]
    live = (pos < hi)[:, None]
    return pos, tl.load(k_words + words, mask=live, other=0), tl.load(v_words + words, mask=live, other=0)


# Per-step integers are not specialized on (== 1, % 16): one compiled kernel serves every batch.
@triton.jit(do_not_specialize=["stride_tab", "num_seqs"])
def _decode_fp8_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
                       table_ptr, seq_lens_ptr, qsl_ptr, k_scale_ptr, v_scale_ptr,
                       stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch,
                       stride_tab, qk_scale, head_dim, num_heads, num_seqs,
                       GROUP: tl.constexpr, MAX_Q: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr, ASM: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if q_len > MAX_Q:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    rows = tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = tok < q_len
    cols = 4 * tl.arange(0, BLOCK_D // 4)  # element 4w: byte 0 of word w
    q_rows = (q_start + tok).to(tl.int64)
    q_base = q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + cols[None, :]
    q0, q1, q2, q3 = _query(q_base, 0, row_ok), _query(q_base, 1, row_ok), _query(q_base, 2, row_ok), \
        _query(q_base, 3, row_ok)
    q_pos = seq_len - q_len + tok
    per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), num_splits) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)
    table_ptr += seq.to(tl.int64) * stride_tab
    kv_head_off = kv_head * stride_ch
    qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
    k_words, v_words = k_cache_ptr.to(tl.pointer_type(tl.int32)), v_cache_ptr.to(tl.pointer_type(tl.int32))
    acc0 = tl.zeros([BLOCK_M, BLOCK_D // 4], dtype=tl.float32)
    acc1, acc2, acc3 = acc0, acc0, acc0
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    pos, kw, vw = _tile(k_words, v_words, table_ptr, lo, hi, kv_head_off, stride_cb, stride_cs, cols, BLOCK_N, PAGE)
    for start in range(lo, hi, BLOCK_N):  # the next tile's words are loaded while this one is used
        pos_next, kw_next, vw_next = _tile(k_words, v_words, table_ptr, start + BLOCK_N, hi, kv_head_off,
                                           stride_cb, stride_cs, cols, BLOCK_N, PAGE)
        k0, k1, k2, k3 = _bytes(kw, ASM)
        qk = tl.dot(q0, tl.trans(k0)) + tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2)) \
            + tl.dot(q3, tl.trans(k3))
        keep = (pos[None, :] <= q_pos[:, None]) & (pos < seq_len)[None, :]
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row may see nothing of this split
        alpha = tl.math.exp2(m_i - m_ref)
        p = tl.math.exp2(qk - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v0, v1, v2, v3 = _bytes(vw, ASM)
        p = p.to(tl.float16)
        acc0 = acc0 * alpha[:, None] + tl.dot(p, v0)
        acc1 = acc1 * alpha[:, None] + tl.dot(p, v1)
        acc2 = acc2 * alpha[:, None] + tl.dot(p, v2)
        acc3 = acc3 * alpha[:, None] + tl.dot(p, v3)
        m_i = m_new
        pos, kw, vw = pos_next, kw_next, vw_next
    v_scale = tl.load(v_scale_ptr + kv_head)
    mask = row_ok[:, None]
    if SPLIT:
        part = ((seq * MAX_Q + tok) * num_heads + head).to(tl.int64) * num_splits + split
        base = part_acc_ptr + part[:, None] * head_dim + cols[None, :]
        scale = v_scale
        tl.store(part_ml_ptr + part, m_i, mask=row_ok)
        tl.store(part_ml_ptr + num_seqs * MAX_Q * num_heads * num_splits + part, l_i, mask=row_ok)
    else:
        base = out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + cols[None, :]
        scale = v_scale / l_i[:, None]
    _store(base, 0, acc0 * scale, mask)
    _store(base, 1, acc1 * scale, mask)
    _store(base, 2, acc2 * scale, mask)
    _store(base, 3, acc3 * scale, mask)

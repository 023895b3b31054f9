"""Varlen causal flash attention over the paged KV cache (prefill, chunked prefill, prefix hits).

Sequence b owns query rows [query_start_loc[b], query_start_loc[b+1]) of the flat batch; its K/V
(cached prefix + this step's tokens, already written by the store kernel) live in the paged cache.

    context of b:   |<------------- seq_len ------------->|
                    |  cached prefix (ctx_start tokens)  |  q_len new tokens  |
    query row j sits at position  q_pos = ctx_start + j  and attends to keys 0 .. q_pos

Grid (num_heads, cdiv(max_query_len, BLOCK_M), B): one program = BLOCK_M query rows of one head of
one sequence (head fastest, so the query heads of one GQA group run side by side and share K/V in L2;
query tiles in reverse, so the tiles with the most keys start first).
Programs past the sequence's q_len, and sequences with q_len < min_query_len (left to the decode
kernel), exit at once. Each program walks the keys in BLOCK_N tiles, in two loops:

    keys:  0                full_end                    mask_end = min(seq_len, ctx_start + m_start + BLOCK_M)
           |== unmasked tiles ==|== causal-masked tiles ==|
    full_end = ctx_start + m_start rounded down to BLOCK_N: every key there precedes every row.

A key position p is read from  cache[block_tables[b, p // PAGE], p % PAGE, kv_head, :]  (block ids are
gathered per tile row, so any page size works). Softmax is online, in float32 and base 2
(scores * scale * log2 e); the first tile holds key 0, which every row sees, so the running max is
finite from the first step on and no row ever divides by zero.

An fp8 cache (SCALED) is read as e4m3 * scale, one scale per KV head: tiles are cast to the query dtype
for the dots, k_scale is folded into the score scale and v_scale into the output (a program sees one KV head).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lamina.kernels.tiles import prefill_config

LOG2E = 1.4426950408889634


@triton.jit
def paged_kv_offsets(table_ptr, start, seq_len, kv_head_off, stride_cb, stride_cs,
                     BLOCK_N: tl.constexpr, PAGE: tl.constexpr):
    """Key positions start .. start + BLOCK_N and their element offsets in the paged cache."""
    pos = start + tl.arange(0, BLOCK_N)
    block = tl.load(table_ptr + pos // PAGE, mask=pos < seq_len, other=0).to(tl.int64)
    return pos, block * stride_cb + (pos % PAGE) * stride_cs + kv_head_off


@triton.jit
def attend_tiles(acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, table_ptr, kv_head_off,
                  stride_cb, stride_cs, lo, hi, q_pos, seq_len, qk_scale, offs_d, dmask,
                  BLOCK_N: tl.constexpr, PAGE: tl.constexpr, MASK: tl.constexpr, PREC: tl.constexpr,
                  EMPTY_ROWS: tl.constexpr, ctx=None, bits=None, TREE: tl.constexpr = False):
    """Online-softmax update of (acc, l_i, m_i) with keys [lo, hi); causal mask only if MASK, or with TREE a row
    sees keys [0, ctx) and key ctx + b for each bit b of bits (lamina.attention.metadata.TreeMask).

    EMPTY_ROWS: a row may see no key of [lo, hi) at all (decode splits that start past its position):
    it then stays at m = -inf, l = 0 without forming -inf - -inf. Prefill rows always see a key."""
    for start in range(lo, hi, BLOCK_N):
        pos, off = paged_kv_offsets(table_ptr, start, seq_len, kv_head_off, stride_cb, stride_cs,
                                    BLOCK_N, PAGE)
        kv_mask = (pos < seq_len)[:, None] & dmask[None, :]
        k = tl.load(k_cache_ptr + off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        if MASK:
            if TREE:
                rel = pos[None, :] - ctx[:, None]
                bit = (bits[:, None] >> tl.minimum(tl.maximum(rel, 0), 62).to(tl.int64)) & 1
                keep = ((rel < 0) | ((rel < 63) & (bit == 1))) & (pos < seq_len)[None, :]
            else:
                keep = (pos[None, :] <= q_pos[:, None]) & (pos < seq_len)[None, :]
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new) if EMPTY_ROWS else m_new
        alpha = tl.math.exp2(m_i - m_ref)
        p = tl.math.exp2(qk - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["stride_tab"])  # the block-table width changes every step
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, table_ptr, seq_lens_ptr, qsl_ptr,
                    k_scale_ptr, v_scale_ptr,
                    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch,
                    stride_tab, qk_scale, head_dim, min_query_len,
                    GROUP: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr, SCALED: tl.constexpr):
    head = tl.program_id(0)
    # last query tiles first: they see the most keys, so the long programs start early (less tail)
    m_start = (tl.num_programs(1) - 1 - tl.program_id(1)) * BLOCK_M
    seq = tl.program_id(2)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if (m_start >= q_len) | (q_len < min_query_len):
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_start = seq_len - q_len
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < head_dim
    row_ok = offs_m < q_len
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & dmask[None, :], other=0.0)
    q_pos = ctx_start + offs_m
    table_ptr += seq.to(tl.int64) * stride_tab
    kv_head_off = (head // GROUP) * stride_ch
    if SCALED:
        qk_scale = qk_scale * tl.load(k_scale_ptr + head // GROUP)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    full_end = ((ctx_start + m_start) // BLOCK_N) * BLOCK_N
    mask_end = tl.minimum(seq_len, ctx_start + m_start + BLOCK_M)
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, table_ptr, kv_head_off,
                                  stride_cb, stride_cs, 0, full_end, q_pos, seq_len, qk_scale,
                                  offs_d, dmask, BLOCK_N, PAGE, False, PREC, False)
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, table_ptr, kv_head_off,
                                  stride_cb, stride_cs, full_end, mask_end, q_pos, seq_len, qk_scale,
                                  offs_d, dmask, BLOCK_N, PAGE, True, PREC, False)
    out = acc / l_i[:, None]
    if SCALED:
        out = out * tl.load(v_scale_ptr + head // GROUP)
    tl.store(out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dmask[None, :])


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 models get true fp32 dots (no silent TF32); 16-bit inputs use the tensor cores as they are."""
    return "ieee" if dtype == torch.float32 else "tf32"


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                      block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                      max_query_len: int, scale: float, min_query_len: int = 1,
                      config: dict[str, int] | None = None,
                      kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Causal attention of q [T, H, D] over the paged cache into out [T, H, D], for every sequence
    with q_len >= min_query_len (the rows of the others are left untouched).

    `config` overrides entries of `prefill_config` (BLOCK_M, BLOCK_N, num_warps, num_stages); kv_scales:
    (k_scale, v_scale) [KV] float32 for an fp8 cache."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return
    assert q.stride(2) == 1 and out.stride(2) == 1 and k_cache.stride(3) == 1
    assert k_cache.stride() == v_cache.stride() and block_tables.stride(1) == 1
    cfg = {**prefill_config(head_dim, q.dtype, max_query_len), **(config or {})}
    grid = (num_heads, triton.cdiv(max_query_len, cfg["BLOCK_M"]), num_seqs)
    k_scale, v_scale = kv_scales or (seq_lens, seq_lens)  # unread when not SCALED
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, k_scale, v_scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        scale * LOG2E, head_dim, min_query_len,
        GROUP=num_heads // num_kv_heads, PAGE=k_cache.shape[1],
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), PREC=dot_precision(q.dtype),
        SCALED=kv_scales is not None, **cfg)

"""Paged decode attention: 1 .. MAX_Q query tokens per sequence, long contexts split across programs.

Grid (B, num_kv_heads, num_splits). Program (b, g, s) takes every query token of sequence b (q_len
of them, q_len <= MAX_Q: one for plain decode, 1 + k for speculative verification) times every
query head of KV group g, as the rows of one tile, so each K/V tile is loaded once per group:

    row r = j * GROUP + i      ->   query token j = r // GROUP,  head = g * GROUP + i
    rows:  [t0 h0, t0 h1, .. t0 h(G-1), t1 h0, ...]  padded to BLOCK_M >= 16 (tl.dot's minimum)

The context [0, seq_len) is cut into num_splits runs of whole BLOCK_N tiles; split s covers

    tiles_per_split = cdiv(cdiv(seq_len, BLOCK_N), num_splits)
    keys [s * tiles_per_split * BLOCK_N, min((s + 1) * tiles_per_split * BLOCK_N, seq_len))

(per sequence, so any num_splits is correct for any batch — a captured CUDA graph can fix it).
Token j sits at position seq_len - q_len + j and sees keys up to it (causal among the 1 + k tokens), or, with a
tree mask (tree drafts), the keys its TreeMask row says (lamina.attention.metadata).
With one split the program normalises and writes the output; otherwise it writes its partial
(running max m, sum l, unnormalised acc; base-2 units) to

    part_acc [B, MAX_Q, H, num_splits, D] fp32      part_ml [2, B, MAX_Q, H, num_splits] fp32

and the reduce kernel, grid (B, MAX_Q, H), combines them:  M = max_s m_s,  w_s = 2^(m_s - M),
out = sum_s w_s acc_s / sum_s w_s l_s. An empty split (or a split a row cannot see) has m = -inf,
l = 0, acc = 0 and weighs nothing; split 0 holds key 0, which every row sees, so M is finite.
Sequences with q_len > MAX_Q belong to the prefill kernel: their programs exit at once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lamina.kernels import pdl
from lamina.kernels.prefill_attention import LOG2E, attend_tiles, dot_precision

MAX_SPLITS = 64


# Per-step integers are not specialized on (== 1, % 16): one compiled kernel serves every batch.
@triton.jit(do_not_specialize=["stride_tab", "num_seqs"])
def _decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
                   table_ptr, seq_lens_ptr, qsl_ptr, k_scale_ptr, v_scale_ptr, ctx_ptr, bits_ptr,
                   stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch,
                   stride_tab, qk_scale, head_dim, num_heads, num_seqs,
                   GROUP: tl.constexpr, MAX_Q: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr,
                   SCALED: tl.constexpr, F16_DOT: tl.constexpr, PDL: tl.constexpr, TREE: tl.constexpr):
    pdl.wait(PDL)
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
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < head_dim
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & dmask[None, :], other=0.0)
    if F16_DOT:  # the dots in fp16 (decode_config); a query past fp16's range is clamped to it, not made inf
        q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
    q_pos = seq_len - q_len + tok
    ctx = q_pos + 1
    bits = tl.zeros([BLOCK_M], dtype=tl.int64)
    if TREE:
        ctx = tl.load(ctx_ptr + q_rows, mask=row_ok, other=0)
        bits = tl.load(bits_ptr + q_rows, mask=row_ok, other=0)
    per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), num_splits) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)
    table_ptr += seq.to(tl.int64) * stride_tab
    kv_head_off = kv_head * stride_ch
    if SCALED:  # an fp8 cache: e4m3 * scale, k_scale folded into the scores, v_scale into acc (linear)
        qk_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    # a row may see nothing of this split (its position precedes it): EMPTY_ROWS
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, k_cache_ptr, v_cache_ptr, table_ptr, kv_head_off,
                                  stride_cb, stride_cs, lo, hi, q_pos, seq_len, qk_scale, offs_d, dmask,
                                  BLOCK_N, PAGE, True, PREC, True, ctx, bits, TREE)
    pdl.launch_dependents(PDL)  # the keys and values are read: the next kernel may be placed
    if SCALED:
        acc = acc * tl.load(v_scale_ptr + kv_head)
    io_mask = row_ok[:, None] & dmask[None, :]
    if SPLIT:
        # partial index of (seq, tok, head, split) in [B, MAX_Q, H, num_splits]
        part = ((seq * MAX_Q + tok) * num_heads + head).to(tl.int64) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * head_dim + offs_d[None, :], acc, mask=io_mask)
        tl.store(part_ml_ptr + part, m_i, mask=row_ok)
        plane = num_seqs * MAX_Q * num_heads * num_splits
        tl.store(part_ml_ptr + plane + part, l_i, mask=row_ok)
    else:
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit(do_not_specialize=["num_splits", "num_seqs"])
def _reduce_kernel(out_ptr, part_acc_ptr, part_ml_ptr, qsl_ptr, stride_ot, stride_oh,
                   head_dim, num_splits, num_seqs,
                   MAX_Q: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)
    seq = tl.program_id(0)
    tok = tl.program_id(1)
    head = tl.program_id(2)
    num_heads = tl.num_programs(2)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if (q_len > MAX_Q) | (tok >= q_len):
        return
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    smask = offs_s < num_splits
    part = ((seq * MAX_Q + tok) * num_heads + head).to(tl.int64) * num_splits + offs_s
    m = tl.load(part_ml_ptr + part, mask=smask, other=float("-inf"))
    plane = num_seqs * MAX_Q * num_heads * num_splits
    l_s = tl.load(part_ml_ptr + plane + part, mask=smask, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * head_dim + offs_d[None, :],
                  mask=smask[:, None] & (offs_d < head_dim)[None, :], other=0.0)
    w = tl.math.exp2(m - tl.max(m, 0))
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l_s * w, 0)
    row = (q_start + tok).to(tl.int64)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < head_dim)


def decode_config(head_dim: int, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> dict[str, int]:
    """Memory bound: what matters is bytes in flight per SM. 16-bit, D <= 128: K and V tiles of
    64 x 128 x 2 = 16 KB each, 3 stages (96 KB); wider rows or fp32 halve BLOCK_N; fp32 keeps 2 stages.
    An fp8 cache holds twice the keys in the same bytes (BLOCK_N doubles) and, under 16-bit queries, takes
    its dots in fp16: e4m3 -> fp16 is one conversion per pair, e4m3 -> bf16 goes through fp32, and the
    conversions, not the bytes, bound the fp8 kernel (scripts/fp8_kv_decode_sweep.py)."""
    wide = dtype == torch.float32 or head_dim > 128
    fp8 = kv_dtype == torch.float8_e4m3fn
    return dict(BLOCK_N=(32 if wide else 64) * (2 if fp8 else 1), num_warps=4,
                num_stages=2 if dtype == torch.float32 else 3, F16_DOT=int(fp8 and dtype != torch.float32))


def choose_num_splits(max_seq_len: int, num_seqs: int, num_kv_heads: int, target_programs: int = 512,
                      min_keys_per_split: int = 512) -> int:
    """Enough (sequence, kv head, split) programs to fill the GPU, but no split under
    `min_keys_per_split` keys (below that, the partials cost more than the parallelism buys).
    512 programs (about 4 per H200 SM) is where the W5 sweep stopped gaining from splits: at batch 64
    x 8 KV heads one split beat two by 1-5% at every context from 1k to 32k."""
    by_length = max(1, max_seq_len // min_keys_per_split)
    by_occupancy = max(1, triton.cdiv(target_programs, max(1, num_seqs * num_kv_heads)))
    return min(by_length, by_occupancy, MAX_SPLITS)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                     max_query_len: int, scale: float, num_splits: int,
                     config: dict[str, int] | None = None,
                     kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: bool = False,
                     tree_mask: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Causal attention over the paged cache for every sequence with q_len <= max_query_len, written
    into out [T, H, D] (the rows of longer sequences are left untouched).

    `num_splits` programs share each (sequence, kv head); `config` overrides entries of
    `decode_config` (BLOCK_N, num_warps, num_stages); kv_scales: (k_scale, v_scale) [KV] float32 for an
    fp8 cache; pdl: launch both kernels with programmatic dependent launch (lamina.kernels.pdl); tree_mask:
    (ctx, bits) [T] int64 of a TreeMask, in place of the causal rule."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return
    assert 1 <= num_splits <= MAX_SPLITS, f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}"
    assert q.stride(2) == 1 and out.stride(2) == 1 and k_cache.stride(3) == 1
    assert k_cache.stride() == v_cache.stride() and block_tables.stride(1) == 1
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    split = num_splits > 1
    part_acc = q.new_empty((num_seqs, max_query_len, num_heads, num_splits, head_dim) if split else (1,),
                           dtype=torch.float32)
    part_ml = q.new_empty((2, num_seqs, max_query_len, num_heads, num_splits) if split else (1,),
                          dtype=torch.float32)
    k_scale, v_scale = kv_scales or (seq_lens, seq_lens)  # unread when not SCALED
    ctx, bits = tree_mask or (seq_lens, seq_lens)  # unread when not TREE
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, out, part_acc, part_ml, block_tables, seq_lens, query_start_loc, k_scale, v_scale,
        ctx, bits,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        scale * LOG2E, head_dim, num_heads, num_seqs,
        GROUP=group, MAX_Q=max_query_len, PAGE=k_cache.shape[1],
        BLOCK_M=max(16, triton.next_power_of_2(max_query_len * group)),
        BLOCK_D=block_d, SPLIT=split, PREC=dot_precision(q.dtype), SCALED=kv_scales is not None, PDL=pdl,
        TREE=tree_mask is not None, launch_pdl=pdl,
        **{**decode_config(head_dim, q.dtype, k_cache.dtype), **(config or {})})
    if split:
        _reduce_kernel[(num_seqs, max_query_len, num_heads)](
            out, part_acc, part_ml, query_start_loc, out.stride(0), out.stride(1),
            head_dim, num_splits, num_seqs,
            MAX_Q=max_query_len, BLOCK_S=MAX_SPLITS, BLOCK_D=block_d,  # one variant for any split count
            PDL=pdl, num_warps=4 if block_d <= 128 else 8, launch_pdl=pdl)

"""Pure-PyTorch paged attention: the CPU path and the oracle for the Triton kernels.

Cache layout, per layer:  k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
A token's slot is block_id * block_size + offset; the flat view [num_blocks * block_size, ...]
is indexed by slot directly.

Sequence i of the batch owns the query rows [query_start_loc[i], query_start_loc[i + 1]) and has
seq_lens[i] tokens in the cache after the store (cached prefix + its new tokens), so

    query row j of sequence i sits at absolute position  seq_lens[i] - q_len_i + j
    and attends to cache positions                        0 .. seq_lens[i] - q_len_i + j

which is what makes chunked prefill, prefix-cache hits and multi-token verification work. With a
`metadata.tree_mask` (tree drafts) every row attends where the mask says instead.
Scores and softmax run in float32; the output is cast back to the query dtype.

An fp8 cache (kv_scales = (k_scale, v_scale), one float32 scale per KV head) stores
e4m3(clamp(x / scale, +-448)) and is read back as float32(e4m3) * scale.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lamina.attention.metadata import AttentionMetadata

KVScales = tuple[torch.Tensor, torch.Tensor]
FP8_MAX = 448.0  # the largest finite e4m3 value


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [T, KV, D] over its per-head scale [KV], clamped to the e4m3 range, cast (round to nearest even)."""
    return (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(dtype)


def dequantize(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """[..., KV, D] entries read from the cache, in float32 (times the per-head scale for an fp8 cache)."""
    return x.float() if scale is None else x.float() * scale[:, None]


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_scales: KVScales | None = None) -> None:
    """Write k, v [T, num_kv_heads, head_dim] into the caches at `slot_mapping` [T]; slot -1 is skipped."""
    if slot_mapping.numel() and int(slot_mapping.min()) < 0:  # padding rows: drop them first
        keep = slot_mapping >= 0
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    for x, cache, scale in ((k, k_cache, None if kv_scales is None else kv_scales[0]),
                            (v, v_cache, None if kv_scales is None else kv_scales[1])):
        x = x.to(cache.dtype) if scale is None else quantize_fp8(x, scale, cache.dtype)
        if cache.element_size() == 1:  # index_copy_ has no fp8 kernel on the CPU: copy the bytes
            cache, x = cache.view(torch.uint8), x.view(torch.uint8)
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slot_mapping, x)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The first `num_tokens` entries of one sequence: [num_tokens, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = -(-num_tokens // block_size)
    blocks = cache[block_table[:num_blocks].long()]  # [n, block_size, kv_heads, head_dim]
    return blocks.flatten(0, 1)[:num_tokens]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            scale: float) -> torch.Tensor:
    """q [B, H, Q, D], k/v [B, KV, S, D], mask [B, 1, Q, S] (True = attend) -> [B, H, Q, D] float32.

    Query head h reads KV head h // (H // KV), as HF's repeat_kv does (SDPA's enable_gqa)."""
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def _prefill_one(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_len: int, scale: float, kv_scales: KVScales | None, mask: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """One sequence with q [q_len, H, D] new tokens at the end of its seq_len context (or seeing the keys of
    `mask` [q_len, seq_len])."""
    q_len = q.shape[0]
    k_scale, v_scale = kv_scales or (None, None)
    k = dequantize(gather_kv(k_cache, block_table, seq_len), k_scale)
    v = dequantize(gather_kv(v_cache, block_table, seq_len), v_scale)
    if mask is None:
        query_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        key_pos = torch.arange(seq_len, device=q.device)
        mask = key_pos[None, :] <= query_pos[:, None]  # [q_len, seq_len]
    out = _attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                  mask[None, None], scale)
    return out[0].transpose(0, 1)  # [q_len, H, D]


def _decode_batch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                  kv_scales: KVScales | None) -> torch.Tensor:
    """B sequences with one query token each (q [B, H, D]), batched over a padded gather."""
    block_size = k_cache.shape[1]
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    table = block_tables[:, :num_blocks].long()
    k_scale, v_scale = kv_scales or (None, None)
    k = dequantize(k_cache[table].flatten(1, 2)[:, :max_len], k_scale)  # [B, S, KV, D]
    v = dequantize(v_cache[table].flatten(1, 2)[:, :max_len], v_scale)
    key_pos = torch.arange(max_len, device=q.device)
    mask = key_pos[None, :] < seq_lens[:, None].to(q.device)  # [B, S]
    out = _attend(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), mask[:, None, None], scale)
    return out[:, :, 0]  # [B, H, D]


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    metadata: AttentionMetadata, scale: float, kv_scales: KVScales | None = None) -> torch.Tensor:
    """Causal attention of q [T, num_heads, head_dim] over the paged cache -> [T, num_heads, head_dim]."""
    starts, seq_lens, tree = metadata.query_start_loc_cpu, metadata.seq_lens_cpu, metadata.tree_mask
    decode = [] if tree is not None else [i for i in range(metadata.num_seqs) if starts[i + 1] - starts[i] == 1]
    if len(decode) == metadata.num_seqs:  # a pure decode batch: no scatter into rows needed
        out = _decode_batch(q, k_cache, v_cache, metadata.block_tables, metadata.seq_lens, scale, kv_scales)
        return out.to(q.dtype)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    if decode:
        rows = torch.tensor([starts[i] for i in decode], device=q.device)
        index = torch.tensor(decode, device=metadata.block_tables.device)
        out[rows] = _decode_batch(q[rows], k_cache, v_cache, metadata.block_tables[index],
                                  metadata.seq_lens[index], scale, kv_scales)
    for i in range(metadata.num_seqs):
        start, end = starts[i], starts[i + 1]
        if end - start > 1 or tree is not None:
            mask = None if tree is None else tree.dense(start, end, seq_lens[i]).to(q.device)  # a no-op on CPU
            out[start:end] = _prefill_one(q[start:end], k_cache, v_cache, metadata.block_tables[i],
                                          seq_lens[i], scale, kv_scales, mask)
    return out.to(q.dtype)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
            v_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
            kv_scales: KVScales | None = None) -> torch.Tensor:
    """Store this step's k, v, then attend: the whole backend contract in one call."""
    store_kv(k, v, k_cache, v_cache, metadata.slot_mapping, kv_scales)
    return paged_attention(q, k_cache, v_cache, metadata, scale, kv_scales)

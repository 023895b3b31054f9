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

from dataclasses import dataclass

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


def stored_rows(slot_mapping: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the rows of a step's k, v to store, None for all; their slots): padding rows (slot -1) dropped."""
    if slot_mapping.numel() and int(slot_mapping.min()) < 0:
        keep = slot_mapping >= 0
        return keep, slot_mapping[keep]
    return None, slot_mapping


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_scales: KVScales | None = None) -> None:
    """Write k, v [T, num_kv_heads, head_dim] into the caches at `slot_mapping` [T]; slot -1 is skipped."""
    _store_rows(k, v, k_cache, v_cache, *stored_rows(slot_mapping), kv_scales)


def _store_rows(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                keep: torch.Tensor | None, slots: torch.Tensor, kv_scales: KVScales | None) -> None:
    """store_kv with its `stored_rows` given."""
    if keep is not None:
        k, v = k[keep], v[keep]
    for x, cache, scale in ((k, k_cache, None if kv_scales is None else kv_scales[0]),
                            (v, v_cache, None if kv_scales is None else kv_scales[1])):
        x = x.to(cache.dtype) if scale is None else quantize_fp8(x, scale, cache.dtype)
        if cache.element_size() == 1:  # index_copy_ has no fp8 kernel on the CPU: copy the bytes
            cache, x = cache.view(torch.uint8), x.view(torch.uint8)
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, x)


def block_ids(block_tables: torch.Tensor, num_tokens: int, block_size: int) -> torch.Tensor:
    """The int64 ids of the blocks that hold a sequence's first `num_tokens` entries: [..., n] of [..., max_blocks]."""
    return block_tables[..., :-(-num_tokens // block_size)].long()


def gather_kv(cache: torch.Tensor, blocks: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The first `num_tokens` entries held by `blocks` ([n], or [B, n] for B sequences):
    [num_tokens, num_kv_heads, head_dim] (or [B, num_tokens, ...])."""
    gathered = cache.index_select(0, blocks.reshape(-1))  # [B * n, block_size, kv_heads, head_dim]
    return gathered.view(*blocks.shape[:-1], -1, *cache.shape[2:]).narrow(-3, 0, num_tokens)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            scale: float) -> torch.Tensor:
    """q [B, H, Q, D], k/v [B, KV, S, D], mask [B, 1, Q, S] (True = attend) -> [B, H, Q, D] float32.

    Query head h reads KV head h // (H // KV), as HF's repeat_kv does (SDPA's enable_gqa)."""
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def _causal_mask(q_len: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, seq_len] bool: the last q_len positions of a seq_len context, each seeing its own past."""
    query_pos = torch.arange(seq_len - q_len, seq_len, device=device)
    return torch.arange(seq_len, device=device)[None, :] <= query_pos[:, None]


def _prefill_one(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: torch.Tensor,
                 seq_len: int, scale: float, kv_scales: KVScales | None, mask: torch.Tensor) -> torch.Tensor:
    """One sequence with q [q_len, H, D] new tokens, seeing the keys of `mask` [q_len, seq_len] among the seq_len
    entries that `blocks` hold."""
    k_scale, v_scale = kv_scales or (None, None)
    k = dequantize(gather_kv(k_cache, blocks, seq_len), k_scale)
    v = dequantize(gather_kv(v_cache, blocks, seq_len), v_scale)
    out = _attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                  mask[None, None], scale)
    return out[0].transpose(0, 1)  # [q_len, H, D]


@dataclass
class DecodePlan:
    """What every layer of a forward gathers for its one-token sequences: their blocks [B, n], the longest
    length, and which keys each sees ([B, 1, 1, max_len]; None for one sequence, which sees them all)."""

    blocks: torch.Tensor
    max_len: int
    mask: torch.Tensor | None

    @classmethod
    def of(cls, block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, device: torch.device
           ) -> DecodePlan:
        max_len = int(seq_lens.max())
        mask = None
        if seq_lens.shape[0] > 1:
            key_pos = torch.arange(max_len, device=device)
            mask = (key_pos[None, :] < seq_lens[:, None].to(device))[:, None, None]  # on the queries' device
        return cls(block_ids(block_tables, max_len, block_size), max_len, mask)


def _decode_batch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan, scale: float,
                  kv_scales: KVScales | None) -> torch.Tensor:
    """B sequences with one query token each (q [B, H, D]), batched over a padded gather."""
    k_scale, v_scale = kv_scales or (None, None)
    k = dequantize(gather_kv(k_cache, plan.blocks, plan.max_len), k_scale)  # [B, S, KV, D]
    v = dequantize(gather_kv(v_cache, plan.blocks, plan.max_len), v_scale)
    out = _attend(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), plan.mask, scale)
    return out[:, :, 0]  # [B, H, D]


def _decode_rows(metadata: AttentionMetadata) -> list[int]:
    """The sequences of a batch with one query token (none with a tree mask: every row follows the tree)."""
    starts = metadata.query_start_loc_cpu
    if metadata.tree_mask is not None:
        return []
    return [i for i in range(metadata.num_seqs) if starts[i + 1] - starts[i] == 1]


def _mixed_decode_plan(metadata: AttentionMetadata, decode: list[int], block_size: int, device: torch.device
                       ) -> tuple[torch.Tensor, DecodePlan]:
    """The query rows of a mixed batch's one-token sequences, and their DecodePlan."""
    rows = torch.tensor([metadata.query_start_loc_cpu[i] for i in decode], device=device)
    index = torch.tensor(decode, device=metadata.block_tables.device)
    plan = DecodePlan.of(metadata.block_tables[index], metadata.seq_lens[index], block_size, device)
    return rows, plan


def _prefill_plan(metadata: AttentionMetadata, i: int, block_size: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence i's blocks and what its query tokens see."""
    start, end, seq_len, tree = (metadata.query_start_loc_cpu[i], metadata.query_start_loc_cpu[i + 1],
                                 metadata.seq_lens_cpu[i], metadata.tree_mask)
    mask = (_causal_mask(end - start, seq_len, device) if tree is None
            else tree.dense(start, end, seq_len).to(device))  # a no-op on CPU
    return block_ids(metadata.block_tables[i], seq_len, block_size), mask


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    metadata: AttentionMetadata, scale: float, kv_scales: KVScales | None = None) -> torch.Tensor:
    """Causal attention of q [T, num_heads, head_dim] over the paged cache -> [T, num_heads, head_dim].

    The gather indices and masks are the same in every layer: made once per forward (`metadata.memo`)."""
    block_size, starts = k_cache.shape[1], metadata.query_start_loc_cpu
    decode = metadata.memo("decode_rows", lambda: _decode_rows(metadata))
    if len(decode) == metadata.num_seqs:  # a pure decode batch: no scatter into rows needed
        plan = metadata.memo("decode", lambda: DecodePlan.of(metadata.block_tables, metadata.seq_lens, block_size,
                                                             q.device))
        return _decode_batch(q, k_cache, v_cache, plan, scale, kv_scales).to(q.dtype)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    if decode:
        rows, plan = metadata.memo("mixed_decode", lambda: _mixed_decode_plan(metadata, decode, block_size, q.device))
        out[rows] = _decode_batch(q[rows], k_cache, v_cache, plan, scale, kv_scales)
    for i in range(metadata.num_seqs):
        start, end = starts[i], starts[i + 1]
        if end - start > 1 or metadata.tree_mask is not None:
            blocks, mask = metadata.memo(("prefill", i),
                                         lambda i=i: _prefill_plan(metadata, i, block_size, q.device))
            out[start:end] = _prefill_one(q[start:end], k_cache, v_cache, blocks, metadata.seq_lens_cpu[i], scale,
                                          kv_scales, mask)
    return out.to(q.dtype)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
            v_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
            kv_scales: KVScales | None = None) -> torch.Tensor:
    """Store this step's k, v, then attend: the whole backend contract in one call."""
    keep, slots = metadata.memo("stored_rows", lambda: stored_rows(metadata.slot_mapping))
    _store_rows(k, v, k_cache, v_cache, keep, slots, kv_scales)
    return paged_attention(q, k_cache, v_cache, metadata, scale, kv_scales)

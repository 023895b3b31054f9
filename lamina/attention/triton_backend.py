"""The Triton attention backend: store this step's K/V, then attend with the fused kernels.

Each sequence of the flat batch goes to one kernel, by its number of new tokens q_len:

    q_len <= DECODE_MAX_Q (plain decode: 1, speculative verification: 1 + k)  -> decode kernel
    q_len >  DECODE_MAX_Q (prefill, prefill chunks, prefix-cache hits)         -> prefill kernel

Both kernels take the whole batch and skip the other kernel's sequences on the GPU, so routing
needs no index tensors; a batch with only one kind launches only that kernel. Importing this
module imports triton: the registry in `backends.py` does it only when "triton" is asked for.
"""
from __future__ import annotations

import logging

import torch

from lamina.attention import torch_ref
from lamina.attention.metadata import AttentionMetadata
from lamina.kernels import pdl
from lamina.kernels.decode_attention import choose_num_splits, decode_attention
from lamina.kernels.prefill_attention import prefill_attention
from lamina.kernels.store_kv import kernels_interpreted, store_kv

logger = logging.getLogger(__name__)

DECODE_MAX_Q = 8
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def supports(head_dim: int, dtype: torch.dtype) -> bool:
    """Head dims 16..256 in steps of 16 (64, 80, 96, 128, 256, ...), in fp16 / bf16 / fp32 (the cache in the
    same dtype or fp8 e4m3)."""
    return head_dim % 16 == 0 and 16 <= head_dim <= 256 and dtype in SUPPORTED_DTYPES


def plan_decode(metadata: AttentionMetadata) -> int:
    """The decode kernel's MAX_Q for this batch: the longest q_len <= DECODE_MAX_Q (0: no decode rows)."""
    if metadata.max_query_len <= DECODE_MAX_Q:
        return metadata.max_query_len
    return DECODE_MAX_Q if metadata.shortest_query_len() <= DECODE_MAX_Q else 0


def _check_no_long_tree(metadata: AttentionMetadata) -> None:
    """The prefill kernel (q_len > DECODE_MAX_Q) is causal only: no tree's rows may go there."""
    tree, starts = metadata.tree_mask, metadata.query_start_loc_cpu
    if tree is None:
        return
    for start, end in zip(starts, starts[1:]):
        if end - start > DECODE_MAX_Q and any(tree.bits_cpu[start:end]):
            raise ValueError(f"a tree of {end - start - 1} nodes: the Triton kernels take trees of at most "
                             f"{DECODE_MAX_Q - 1} (speculative_token_tree; attention_backend 'torch' takes more)")


class TritonAttentionBackend:
    """`forward(q [T, H, D], k [T, KV, D], v [T, KV, D], k_cache, v_cache, metadata, scale) -> [T, H, D]`.

    Tensors must be on CUDA, or the kernels must run under TRITON_INTERPRET=1 (CPU tests). With
    `cpu_fallback=True` (what "auto" builds) CPU tensors go to the torch reference instead of failing.
    Unsupported head dims / dtypes fall back to the torch reference with one log line.
    """

    name = "triton"

    def __init__(self, cpu_fallback: bool = False, num_splits: int | None = None, pdl: bool = True) -> None:
        self.cpu_fallback = cpu_fallback
        self.num_splits = num_splits  # fixed decode split count (CUDA graphs); None: from the context
        self.pdl = pdl  # the KV store and decode kernels launch with PDL where the GPU has it (lamina.kernels.pdl)
        self._logged: set[tuple[int, torch.dtype]] = set()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
                kv_scales: torch_ref.KVScales | None = None) -> torch.Tensor:
        if not self._use_kernels(q, k_cache):
            return torch_ref.forward(q, k, v, k_cache, v_cache, metadata, scale, kv_scales)
        use_pdl = self.pdl and pdl.supported(q)
        store_kv(k, v, k_cache, v_cache, metadata.slot_mapping, kv_scales, pdl=use_pdl)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        args = (metadata.block_tables, metadata.seq_lens, metadata.query_start_loc)
        tree = metadata.tree_mask
        if metadata.max_query_len > DECODE_MAX_Q:
            _check_no_long_tree(metadata)
            prefill_attention(q, k_cache, v_cache, out, *args, metadata.max_query_len, scale,
                              min_query_len=DECODE_MAX_Q + 1, kv_scales=kv_scales)
        decode_max_q = plan_decode(metadata)
        if decode_max_q:
            splits = self.num_splits or choose_num_splits(metadata.max_seq_len, metadata.num_seqs,
                                                          k_cache.shape[2])
            decode_attention(q, k_cache, v_cache, out, *args, decode_max_q, scale, splits, kv_scales=kv_scales,
                             pdl=use_pdl, tree_mask=None if tree is None else (tree.ctx, tree.bits))
        return out

    def _use_kernels(self, q: torch.Tensor, k_cache: torch.Tensor) -> bool:
        head_dim = q.shape[-1]
        if not supports(head_dim, q.dtype) or k_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
            key = (head_dim, k_cache.dtype)
            if key not in self._logged:
                self._logged.add(key)
                logger.warning("triton attention: head_dim %d with %s queries / %s cache is not supported; "
                               "using the torch reference", head_dim, q.dtype, k_cache.dtype)
            return False
        if q.is_cuda or kernels_interpreted():
            return True
        if self.cpu_fallback:
            return False
        raise ValueError(f"attention_backend='triton' needs CUDA tensors, got {q.device} (the Triton "
                         "interpreter is off); use attention_backend='torch' or 'auto' on CPU")

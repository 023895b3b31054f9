"""The attention layer a model holds: store new K/V into this layer's paged cache, then attend."""
from __future__ import annotations

import torch
from torch import nn

from lamina.attention.backends import AttentionBackend, get_attention_backend
from lamina.attention.metadata import get_attention_metadata


FP8_KV_DTYPE = torch.float8_e4m3fn


class Attention(nn.Module):
    """Paged multi-head / grouped-query attention over a flat batch.

    `kv_cache` is (K, V), each [num_blocks, block_size, num_kv_heads, head_dim], bound after the
    model is built by `lamina.kv.cache.bind_kv_caches`. Metadata (slot mapping, block tables,
    seq lens) comes from the `set_attention_metadata` context of the current forward.

    An fp8 cache (kv_cache_dtype="fp8") holds K / k_scale and V / v_scale in e4m3, one scale per KV head
    (buffers [num_kv_heads] float32: the checkpoint's self_attn.k_scale / v_scale, else measured at start-up by
    lamina.kv.fp8_scales): the backend divides on store and multiplies back on read.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 backend: AttentionBackend | None = None) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of "
                             f"num_key_value_heads ({num_kv_heads})")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.backend = backend or get_attention_backend("auto")
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        # not in state_dict: a checkpoint without them loads, one with them sets them (CausalLM.load_weights)
        self.register_buffer("k_scale", torch.ones(num_kv_heads, dtype=torch.float32), persistent=False)
        self.register_buffer("v_scale", torch.ones(num_kv_heads, dtype=torch.float32), persistent=False)
        self.kv_scales_loaded = False  # set by load_kv_scale; else lamina.kv.fp8_scales measures them for fp8

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, num_heads * head_dim], k/v [T, num_kv_heads * head_dim] -> [T, num_heads * head_dim]."""
        if self.kv_cache is None:
            raise RuntimeError("Attention.kv_cache is not bound; call lamina.kv.cache.bind_kv_caches first")
        num_tokens = q.shape[0]
        k_cache, v_cache = self.kv_cache
        kv_scales = (self.k_scale, self.v_scale) if k_cache.dtype == FP8_KV_DTYPE else None
        out = self.backend.forward(
            q.reshape(num_tokens, self.num_heads, self.head_dim),
            k.reshape(num_tokens, self.num_kv_heads, self.head_dim),
            v.reshape(num_tokens, self.num_kv_heads, self.head_dim),
            k_cache, v_cache, get_attention_metadata(), self.scale, kv_scales)
        return out.reshape(num_tokens, self.num_heads * self.head_dim)

    def load_kv_scale(self, which: str, tensor: torch.Tensor) -> None:
        """Set `which` ("k_scale" or "v_scale") from a checkpoint tensor: one scale per KV head, or one for all."""
        buffer = {"k_scale": self.k_scale, "v_scale": self.v_scale}[which]
        values = tensor.float().reshape(-1)
        if values.numel() not in (1, buffer.numel()):
            raise ValueError(f"{values.numel()} scales, expected 1 or one per KV head ({buffer.numel()})")
        if not bool(torch.isfinite(values).all() and (values > 0).all()):
            raise ValueError("scales must be positive and finite")
        buffer.copy_(values.to(buffer.device).expand(buffer.numel()))
        self.kv_scales_loaded = True

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"backend={self.backend.name}")

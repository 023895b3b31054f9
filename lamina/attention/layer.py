"""The attention layer a model holds: store new K/V into this layer's paged cache, then attend."""
from __future__ import annotations

import torch
from torch import nn

from lamina.attention.backends import AttentionBackend, get_attention_backend
from lamina.attention.metadata import get_attention_metadata


class Attention(nn.Module):
    """Paged multi-head / grouped-query attention over a flat batch.

    `kv_cache` is (K, V), each [num_blocks, block_size, num_kv_heads, head_dim], bound after the
    model is built by `lamina.kv.cache.bind_kv_caches`. Metadata (slot mapping, block tables,
    seq lens) comes from the `set_attention_metadata` context of the current forward.
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

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, num_heads * head_dim], k/v [T, num_kv_heads * head_dim] -> [T, num_heads * head_dim]."""
        if self.kv_cache is None:
            raise RuntimeError("Attention.kv_cache is not bound; call lamina.kv.cache.bind_kv_caches first")
        num_tokens = q.shape[0]
        out = self.backend.forward(
            q.reshape(num_tokens, self.num_heads, self.head_dim),
            k.reshape(num_tokens, self.num_kv_heads, self.head_dim),
            v.reshape(num_tokens, self.num_kv_heads, self.head_dim),
            self.kv_cache[0], self.kv_cache[1], get_attention_metadata(), self.scale)
        return out.reshape(num_tokens, self.num_heads * self.head_dim)

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"backend={self.backend.name}")

"""Attention backend registry.

A backend stores one step's K/V into the paged cache and attends over it:

    forward(q [T, H, D], k [T, KV, D], v [T, KV, D], k_cache, v_cache, metadata, scale) -> [T, H, D]

"torch" is the pure-PyTorch reference (runs everywhere); the Triton backend registers here later,
imported lazily so that the package imports on machines without a GPU.
"""
from __future__ import annotations

from typing import Protocol

import torch

from lamina.attention import torch_ref
from lamina.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        ...


class TorchAttentionBackend:
    """The reference path: `torch_ref.store_kv` then `torch_ref.paged_attention`."""

    name = "torch"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: AttentionMetadata, scale: float) -> torch.Tensor:
        return torch_ref.forward(q, k, v, k_cache, v_cache, metadata, scale)


_BACKENDS: dict[str, type] = {"torch": TorchAttentionBackend}


def available_attention_backends() -> list[str]:
    return ["auto", *_BACKENDS]


def get_attention_backend(name: str = "auto") -> AttentionBackend:
    """The backend called `name`; "auto" picks the best one available (the torch reference for now)."""
    if name == "auto":
        name = "torch"
    if name not in _BACKENDS:
        raise ValueError(f"attention_backend must be one of {available_attention_backends()}, "
                         f"got {name!r}")
    return _BACKENDS[name]()

"""Rotary position embedding, neox style (the rotate-half layout Llama / Mistral / Qwen use).

For a head vector x = [x1 | x2] (two halves) at position p with frequencies f:
    out = [x1 * cos(p f) - x2 * sin(p f) | x2 * cos(p f) + x1 * sin(p f)]

cos/sin of every position below max_position_embeddings are tabulated once in float32 from the same
products position * inv_freq that HF computes, so a forward gathers rows instead of recomputing them.

Where lamina.layers.dispatch allows it (CUDA, triton installed, the model's KernelChoice.fused_ops), q and
k are rotated in place by one Triton kernel (`lamina.kernels.fused_ops.rotary_inplace`, same fp32 math);
otherwise by `_rotate` below, which returns new tensors.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from lamina.config import KernelChoice
from lamina.layers.dispatch import DEFAULT_KERNELS, pdl_for, rotary_ops

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_type_of(rope_scaling: dict[str, Any] | None) -> str:
    if not rope_scaling:
        return "default"
    return str(rope_scaling.get("rope_type", rope_scaling.get("type", "default")))


def check_rope_scaling(rope_scaling: dict[str, Any] | None) -> None:
    """Refuse a RoPE scaling type lamina does not implement (clear error, before any weights load)."""
    rope_type = rope_type_of(rope_scaling)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_scaling.rope_type: {rope_type!r} is not supported; "
                         f"supported types are {list(SUPPORTED_ROPE_TYPES)}")


def _require(params: dict[str, Any], key: str, rope_type: str) -> float:
    if params.get(key) is None:
        raise ValueError(f"rope_scaling.{key} is required for rope_type {rope_type!r}")
    return float(params[key])


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any],
                     max_position_embeddings: int) -> torch.Tensor:
    """Llama 3.1 frequency smoothing; mirrors HF's `_compute_llama3_parameters` step by step."""
    factor = _require(params, "factor", "llama3")
    low_freq_factor = _require(params, "low_freq_factor", "llama3")
    high_freq_factor = _require(params, "high_freq_factor", "llama3")
    old_context_len = params.get("original_max_position_embeddings") or max_position_embeddings
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed, inv_freq_llama)


def compute_inv_freq(rotary_dim: int, base: float, rope_scaling: dict[str, Any] | None,
                     max_position_embeddings: int) -> torch.Tensor:
    """Inverse frequencies [rotary_dim // 2] in float32 for the configured RoPE type."""
    check_rope_scaling(rope_scaling)
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
    inv_freq = 1.0 / (base ** exponents)
    rope_type = rope_type_of(rope_scaling)
    if rope_type == "linear":
        return inv_freq / _require(rope_scaling or {}, "factor", "linear")
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling or {}, max_position_embeddings)
    return inv_freq


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out if out.dtype == x.dtype else out.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q and k of a flat batch: q [T, num_heads * head_dim] (or [T, heads, head_dim]).

    cos and sin of every position up to max_position_embeddings are tabulated once (float32,
    [max_pos, head_dim]: cos | sin), so a forward is one row gather; one instance serves all layers.
    Where dispatch allows, the fused kernel rotates q and k in place and returns them.
    """

    def __init__(self, head_dim: int, base: float, max_position_embeddings: int,
                 rope_scaling: dict[str, Any] | None = None, kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.kernels = kernels
        inv_freq = compute_inv_freq(head_dim, base, rope_scaling, max_position_embeddings)
        freqs = torch.arange(max_position_embeddings, dtype=torch.float32)[:, None] * inv_freq[None, :]
        # float32 whatever the model dtype; not in the state dict (HF's is not loaded either).
        self.register_buffer("inv_freq", inv_freq.to(torch.float32), persistent=False)
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1), persistent=False)

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        # Keep the tables in float32 when the module is cast with .to(dtype) / .half().
        tables = {name: getattr(self, name) for name in ("inv_freq", "cos_sin_cache")}
        super()._apply(fn, recurse)
        for name, table in tables.items():
            setattr(self, name, table.to(device=getattr(self, name).device, dtype=torch.float32))
        return self

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        ops = rotary_ops(q, k, self.kernels)
        if ops is not None:
            ops.rotary_inplace(q, k, self.cos_sin_cache, positions, self.head_dim, pdl=pdl_for(q, self.kernels))
            return q, k
        cos, sin = self.cos_sin_cache.index_select(0, positions)[:, None, :].chunk(2, dim=-1)
        q_heads = q.view(q.shape[0], -1, self.head_dim)
        qk = torch.cat((q_heads, k.view(k.shape[0], -1, self.head_dim)), dim=1)  # one rotation for both
        q_out, k_out = _rotate(qk, cos, sin).split([q_heads.shape[1], qk.shape[1] - q_heads.shape[1]], dim=1)
        return q_out.reshape(q.shape), k_out.reshape(k.shape)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}"

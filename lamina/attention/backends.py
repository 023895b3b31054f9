"""Attention backend registry.

A backend stores one step's K/V into the paged cache and attends over it:

    forward(q [T, H, D], k [T, KV, D], v [T, KV, D], k_cache, v_cache, metadata, scale, kv_scales) -> [T, H, D]

kv_scales: None for a cache in the model's dtype; (k_scale, v_scale), each [KV] float32, for an fp8 cache
(stored: x / scale in e4m3; read: e4m3 * scale).

"torch" is the pure-PyTorch reference (runs everywhere); "triton" is the fused-kernel backend
(`triton_backend.py`), imported only when it is asked for, so that the package imports and runs on
machines without triton or a GPU. "auto" is "triton" when CUDA is available and triton imports,
else "torch".
"""
from __future__ import annotations

import importlib
import logging
from typing import Protocol

import torch

from lamina.attention import torch_ref
from lamina.attention.metadata import AttentionMetadata
from lamina.attention.torch_ref import KVScales

logger = logging.getLogger(__name__)


class AttentionBackend(Protocol):
    name: str

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
                kv_scales: KVScales | None = None) -> torch.Tensor:
        ...


class TorchAttentionBackend:
    """The reference path: `torch_ref.store_kv` then `torch_ref.paged_attention`."""

    name = "torch"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, metadata: AttentionMetadata, scale: float,
                kv_scales: KVScales | None = None) -> torch.Tensor:
        return torch_ref.forward(q, k, v, k_cache, v_cache, metadata, scale, kv_scales)


_BACKENDS: dict[str, type] = {"torch": TorchAttentionBackend}
_LAZY_BACKENDS = {"triton": ("lamina.attention.triton_backend", "TritonAttentionBackend")}


def available_attention_backends() -> list[str]:
    return ["auto", *_BACKENDS, *_LAZY_BACKENDS]


def _triton_usable() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        logger.warning("CUDA is available but triton does not import (%s): the PyTorch attention path, "
                       "no fused kernels, no CUDA graphs", exc)
        return False
    return True


def _load_lazy(name: str, **kwargs: object) -> AttentionBackend:
    module_name, class_name = _LAZY_BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"attention_backend={name!r} needs the {name} package, which does not import "
                         f"here ({exc}); use attention_backend='torch'") from exc
    return getattr(module, class_name)(**kwargs)


def get_attention_backend(name: str = "auto", pdl: bool = True) -> AttentionBackend:
    """The backend called `name`; "auto" is "triton" on a machine with CUDA and triton, else "torch".

    The "triton" picked by "auto" sends CPU tensors to the torch reference (a CPU model on a GPU
    machine); asked for by name, it refuses them unless the Triton interpreter is on. pdl: the triton
    backend's kernels may launch with programmatic dependent launch (KernelChoice.pdl)."""
    if name == "auto":
        return _load_lazy("triton", cpu_fallback=True, pdl=pdl) if _triton_usable() else TorchAttentionBackend()
    if name in _LAZY_BACKENDS:
        return _load_lazy(name, pdl=pdl)
    if name not in _BACKENDS:
        raise ValueError(f"attention_backend must be one of {available_attention_backends()}, "
                         f"got {name!r}")
    return _BACKENDS[name]()

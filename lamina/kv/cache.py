"""Per-layer paged KV tensors: sizing, allocation, and binding them to the model's attention layers.

Per layer: K and V, each [num_blocks, block_size, num_kv_heads, head_dim]; block 0 is the null block.
"""
from __future__ import annotations

import torch
from torch import nn

from lamina.attention.layer import FP8_KV_DTYPE, Attention
from lamina.config import ModelArch

KVCache = tuple[torch.Tensor, torch.Tensor]
MIN_NUM_BLOCKS = 2  # the null block plus at least one usable block


def resolve_kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """CacheConfig.kv_cache_dtype as a torch dtype: "auto" is the model's, "fp8" / "fp8_e4m3" e4m3."""
    return model_dtype if kv_cache_dtype == "auto" else FP8_KV_DTYPE


def kv_cache_bytes_per_block(arch: ModelArch, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers: 2 (K and V) * layers * block_size * kv_heads * head_dim * elem."""
    element_size = torch.empty((), dtype=dtype).element_size()
    per_layer = 2 * block_size * arch.num_key_value_heads * arch.head_dim * element_size
    return per_layer * arch.num_hidden_layers


def num_blocks_for_bytes(arch: ModelArch, block_size: int, dtype: torch.dtype, num_bytes: int) -> int:
    """How many blocks fit in `num_bytes`; ValueError when fewer than MIN_NUM_BLOCKS fit."""
    per_block = kv_cache_bytes_per_block(arch, block_size, dtype)
    num_blocks = num_bytes // per_block
    if num_blocks < MIN_NUM_BLOCKS:
        raise ValueError(f"kv_cache_memory_bytes={num_bytes} holds {num_blocks} block(s) of {per_block} bytes; "
                         f"at least {MIN_NUM_BLOCKS * per_block} bytes are needed for {MIN_NUM_BLOCKS} blocks")
    return num_blocks


def allocate_kv_caches(arch: ModelArch, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device | str) -> list[KVCache]:
    """One zeroed (K, V) pair per layer.

    Zeroed, not empty: padded gathers read unused slots with zero attention weight, and
    0 * NaN from uninitialised memory would still poison the output.
    """
    if num_blocks < MIN_NUM_BLOCKS:
        raise ValueError(f"num_kv_blocks must be >= {MIN_NUM_BLOCKS} (block 0 is the null block), got {num_blocks}")
    shape = (num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(arch.num_hidden_layers)]


def attention_layers(model: nn.Module) -> list[Attention]:
    """The model's Attention modules in layer order (module registration order)."""
    return [m for m in model.modules() if isinstance(m, Attention)]


def bind_kv_caches(model: nn.Module, caches: list[KVCache]) -> None:
    """Give attention layer i the cache pair caches[i]."""
    layers = attention_layers(model)
    if len(layers) != len(caches):
        raise ValueError(f"model has {len(layers)} attention layers but {len(caches)} KV caches were given")
    for layer, cache in zip(layers, caches):
        layer.kv_cache = cache


def move_kv(caches: list[KVCache], src_slots: list[int], dst_slots: list[int]) -> None:
    """Copy the K and V of slots `src_slots` to `dst_slots` in every cache (tree drafts: an accepted node's KV
    to the slot of its position). All sources are read before any destination is written."""
    if not src_slots:
        return
    device = caches[0][0].device
    src = torch.tensor(src_slots, dtype=torch.int64).to(device, non_blocking=True)
    dst = torch.tensor(dst_slots, dtype=torch.int64).to(device, non_blocking=True)
    for pair in caches:
        for cache in pair:
            flat = (cache.view(torch.uint8) if cache.element_size() == 1 else cache).flatten(0, 1)
            flat.index_copy_(0, dst, flat.index_select(0, src))

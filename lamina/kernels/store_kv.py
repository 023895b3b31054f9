"""KV-store kernel: write this step's K/V rows into the paged cache at their slots.

    k, v:               [T, num_kv_heads, head_dim]          (any token / head strides, dim stride 1)
    k_cache, v_cache:   [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping[t]:    block_id * block_size + offset,  -1 = skip (padding rows)

Grid (T,): program t copies the [num_kv_heads, head_dim] tile of token t (both padded to powers
of two and masked, so any head count / head_dim works).

    slot = slot_mapping[t]            block = slot // block_size    offset = slot % block_size
    k_cache[block, offset, :, :] = k[t, :, :]      (cast to the cache dtype; int64 offsets)

An fp8 cache (SCALED) stores e4m3(clamp(k[t, h, :] / k_scale[h], +-448)), as lamina.attention.torch_ref does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from lamina.kernels import pdl

FP8_MAX = tl.constexpr(448.0)  # the largest finite e4m3 value


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_cb, stride_cs, stride_ch,
                     block_size, num_kv_heads, head_dim,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, SCALED: tl.constexpr, PDL: tl.constexpr):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // block_size
    offset = slot % block_size
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_kv_heads) & (d < head_dim)
    k = tl.load(k_ptr + token * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + h * stride_vh + d, mask=mask)
    if SCALED:
        heads = tl.arange(0, BLOCK_H)
        k_scale = tl.load(k_scale_ptr + heads, mask=heads < num_kv_heads, other=1.0)
        v_scale = tl.load(v_scale_ptr + heads, mask=heads < num_kv_heads, other=1.0)
        k = tl.clamp(k.to(tl.float32) / k_scale[:, None], -FP8_MAX, FP8_MAX)
        v = tl.clamp(v.to(tl.float32) / v_scale[:, None], -FP8_MAX, FP8_MAX)
    dst = block * stride_cb + offset * stride_cs + h * stride_ch + d
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def kernels_interpreted() -> bool:
    """True when the kernels were decorated under TRITON_INTERPRET=1 (they then run on CPU tensors)."""
    return isinstance(_store_kv_kernel, InterpretedFunction)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
             pdl: bool = False) -> None:
    """Write k, v [T, num_kv_heads, head_dim] into the caches at `slot_mapping` [T]; slot -1 is skipped.
    kv_scales: (k_scale, v_scale) [num_kv_heads] float32 for an fp8 cache; pdl: launch with programmatic
    dependent launch (lamina.kernels.pdl)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(2) == 1 and v.stride(2) == 1, "k/v head_dim must be contiguous"
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1, "caches must share a layout"
    assert slot_mapping.shape == (num_tokens,), "slot_mapping must be [T]"
    tile = num_kv_heads * head_dim
    k_scale, v_scale = kv_scales or (slot_mapping, slot_mapping)  # unread when not SCALED
    _store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[1], num_kv_heads, head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        SCALED=kv_scales is not None, PDL=pdl, num_warps=1 if tile <= 256 else (4 if tile <= 2048 else 8),
        launch_pdl=pdl)

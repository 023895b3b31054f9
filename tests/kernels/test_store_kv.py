"""The KV-store kernel against torch_ref.store_kv: same bytes in the cache, slot -1 skipped."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (CI installs it with the test extra)")

from lamina.attention import torch_ref  # noqa: E402
from lamina.kernels.store_kv import store_kv  # noqa: E402


def _caches(num_blocks: int, block_size: int, kv: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    shape = (num_blocks, block_size, kv, d)
    return torch.full(shape, float("nan"), dtype=dtype), torch.full(shape, float("nan"), dtype=dtype)


@pytest.mark.parametrize("dtype,cache_dtype,kv,d", [
    (torch.float32, torch.float32, 2, 64),
    (torch.bfloat16, torch.bfloat16, 1, 128),
    (torch.float32, torch.bfloat16, 3, 80),  # cast on store; odd head count and head_dim
])
def test_store_kv_matches_reference(dtype: torch.dtype, cache_dtype: torch.dtype, kv: int, d: int) -> None:
    gen = torch.Generator().manual_seed(kv * d)
    num_tokens, block_size, num_blocks = 11, 4, 6
    # Like the model's fused qkv projection: k and v are strided views into one wider tensor.
    qkv = torch.randn(num_tokens, 2 * kv + 1, d, generator=gen).to(dtype)
    k, v = qkv[:, 1:1 + kv], qkv[:, 1 + kv:]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1  # padding rows
    expected_k, expected_v = _caches(num_blocks, block_size, kv, d, cache_dtype)
    torch_ref.store_kv(k, v, expected_k, expected_v, slots)
    k_cache, v_cache = _caches(num_blocks, block_size, kv, d, cache_dtype)
    store_kv(k, v, k_cache, v_cache, slots)
    # Same dtype: the same bytes. A cast on store: within one bf16 ulp (the interpreter's fp32 -> bf16
    # cast truncates where the GPU rounds to nearest even).
    tol = dict(atol=0.0, rtol=0.0 if dtype == cache_dtype else 2.0 ** -7)
    torch.testing.assert_close(k_cache, expected_k, equal_nan=True, **tol)
    torch.testing.assert_close(v_cache, expected_v, equal_nan=True, **tol)
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    assert not k_cache.view(-1, kv, d)[written].isnan().any()
    assert k_cache.view(-1, kv, d)[~written].isnan().all()  # -1 rows and untouched slots stay poisoned


def test_store_kv_all_padding_and_empty() -> None:
    k_cache, v_cache = _caches(2, 4, 2, 16, torch.float32)
    k = torch.randn(3, 2, 16)
    store_kv(k, k, k_cache, v_cache, torch.full((3,), -1, dtype=torch.int64))
    store_kv(k[:0], k[:0], k_cache, v_cache, torch.empty(0, dtype=torch.int64))
    assert k_cache.isnan().all() and v_cache.isnan().all()

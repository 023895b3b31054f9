"""Random paged-attention batches for the kernel tests (and scripts/gpu_check.py at real shapes).

    case = make_case(seq_lens=[37, 20], q_lens=[37, 11], num_heads=4, num_kv_heads=2, head_dim=64,
                     block_size=16, dtype=torch.bfloat16)

Sequence i has seq_lens[i] tokens of context after this step, of which the last q_lens[i] are new:
its cached prefix is already in the cache; its new K/V are in case.k / case.v, to be stored through
case.metadata.slot_mapping. Blocks are scattered (shuffled ids, never block 0) and every cache slot
no sequence owns — block 0 and the tails of last blocks included — holds NaN, so a kernel that reads
past a sequence's end or through a padded table entry poisons its output.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lamina.attention import torch_ref
from lamina.attention.metadata import AttentionMetadata
from tests.helpers.paged import build_metadata


@dataclass
class Case:
    q: torch.Tensor  # [T, H, D]
    k: torch.Tensor  # [T, KV, D] this step's keys
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, KV, D], prefixes stored, NaN elsewhere
    v_cache: torch.Tensor
    metadata: AttentionMetadata
    scale: float

    def stored_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the caches with this step's K/V stored by the reference."""
        k_cache, v_cache = self.k_cache.clone(), self.v_cache.clone()
        torch_ref.store_kv(self.k, self.v, k_cache, v_cache, self.metadata.slot_mapping)
        return k_cache, v_cache

    def reference(self) -> torch.Tensor:
        """torch_ref attention in float32 (NaN poison zeroed: the reference's padded gather reads it)."""
        k_cache, v_cache = self.stored_caches()
        return torch_ref.paged_attention(self.q.float(), k_cache.float().nan_to_num(0.0),
                                         v_cache.float().nan_to_num(0.0), self.metadata, self.scale)


def _block_tables(seq_lens: list[int], block_size: int, generator: torch.Generator) -> tuple[list[list[int]], int]:
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + 3  # a few blocks nobody owns
    perm = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
    tables = []
    for n in need:
        tables.append(perm[:n])
        perm = perm[n:]
    return tables, num_blocks


def make_case(seq_lens: list[int], q_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
              block_size: int, dtype: torch.dtype = torch.float32, seed: int = 0,
              device: str | torch.device = "cpu") -> Case:
    tables, num_blocks = _block_tables(seq_lens, block_size, torch.Generator().manual_seed(seed))
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=device)
    for table, n, q_len in zip(tables, seq_lens, q_lens):
        if n > q_len:
            prefix = build_metadata([(table, 0, n - q_len)], block_size, device)
            torch_ref.store_kv(randn(n - q_len, num_kv_heads, head_dim), randn(n - q_len, num_kv_heads, head_dim),
                               k_cache, v_cache, prefix.slot_mapping)
    metadata = build_metadata([(t, n - q, q) for t, n, q in zip(tables, seq_lens, q_lens)], block_size,
                              device)
    total = sum(q_lens)
    return Case(randn(total, num_heads, head_dim), randn(total, num_kv_heads, head_dim),
                randn(total, num_kv_heads, head_dim), k_cache, v_cache, metadata, head_dim ** -0.5)


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """fp32: the kernels' fp32 dots vs the reference's; bf16/fp16: P is rounded before the PV dot."""
    return {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=4e-3, rtol=4e-3),
            torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}[dtype]


def assert_close_elementwise(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Every element written and close: fp32 within a few ulps (only the order of a sum may differ),
    bf16 within about one bf16 ulp (2^-8 relative) of the values' scale."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert not actual.isnan().any(), "an element was not written"
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    else:
        scale = expected.float().abs().max().item()
        torch.testing.assert_close(actual.float(), expected.float(), atol=1e-2 * scale, rtol=1e-2)

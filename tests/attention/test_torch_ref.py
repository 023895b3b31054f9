"""The reference paged attention against dense attention written out by hand (float64)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lamina.attention import torch_ref
from lamina.attention.backends import TorchAttentionBackend, available_attention_backends, get_attention_backend
from lamina.attention.layer import Attention
from lamina.attention.metadata import set_attention_metadata
from tests.helpers.paged import build_metadata

H, KV, D, BS = 4, 2, 8, 4
SCALE = D ** -0.5


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [Q, H, D] = the last Q of S positions; k, v [S, KV, D]; causal; float64 softmax."""
    q_len, seq_len = q.shape[0], k.shape[0]
    k, v = k.double().repeat_interleave(H // KV, 1), v.double().repeat_interleave(H // KV, 1)
    scores = torch.einsum("qhd,shd->hqs", q.double(), k) * SCALE
    future = torch.arange(seq_len)[None, :] > torch.arange(seq_len - q_len, seq_len)[:, None]
    weights = scores.masked_fill(future, float("-inf")).softmax(-1)
    return torch.einsum("hqs,shd->qhd", weights, v).float()


def scattered_blocks(lengths: list[int], num_blocks: int, seed: int) -> list[list[int]]:
    """Non-contiguous, shuffled block ids (never block 0) so that the gather really follows the table."""
    perm = (torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(seed)) + 1).tolist()
    tables = []
    for n in lengths:
        need = -(-n // BS)
        tables.append(perm[:need])
        perm = perm[need:]
    return tables


@pytest.mark.parametrize("seq_lens,q_lens", [
    ([9], [9]),  # plain prefill, partial last block
    ([13, 1, 8, 20], [5, 1, 8, 1]),  # chunk over a prefix, decode of length 1, prefill, decode
    ([7, 12, 16], [1, 1, 1]),  # decode-only batch of different lengths
    ([10, 6], [3, 2]),  # multi-token verification over a prefix
])
def test_paged_attention_matches_dense(seq_lens: list[int], q_lens: list[int]) -> None:
    gen = torch.Generator().manual_seed(sum(seq_lens))
    k_cache, v_cache = torch.zeros(32, BS, KV, D), torch.zeros(32, BS, KV, D)
    tables = scattered_blocks(seq_lens, 32, seed=len(seq_lens))
    full_k = [torch.randn(n, KV, D, generator=gen) for n in seq_lens]
    full_v = [torch.randn(n, KV, D, generator=gen) for n in seq_lens]
    # The cached prefixes are already in place; this step's tokens go through store_kv.
    for table, k, v, n, q in zip(tables, full_k, full_v, seq_lens, q_lens):
        slots = torch.tensor([table[pos // BS] * BS + pos % BS for pos in range(n - q)], dtype=torch.int64)
        torch_ref.store_kv(k[:n - q], v[:n - q], k_cache, v_cache, slots)
    metadata = build_metadata([(t, n - q, q) for t, n, q in zip(tables, seq_lens, q_lens)], BS)
    q = torch.randn(sum(q_lens), H, D, generator=gen)
    new_k = torch.cat([k[n - ql:] for k, n, ql in zip(full_k, seq_lens, q_lens)])
    new_v = torch.cat([v[n - ql:] for v, n, ql in zip(full_v, seq_lens, q_lens)])
    out = torch_ref.forward(q, new_k, new_v, k_cache, v_cache, metadata, SCALE)
    starts = metadata.query_start_loc_cpu
    for i in range(len(seq_lens)):
        expected = dense_reference(q[starts[i]:starts[i + 1]], full_k[i], full_v[i])
        torch.testing.assert_close(out[starts[i]:starts[i + 1]], expected, atol=1e-5, rtol=1e-5)


def test_a_forward_makes_what_its_layers_share_once() -> None:
    """metadata.memo: once inside one set_attention_metadata context, afresh on entering it again (a captured
    forward's buffers are refilled in place between replays), never kept outside it."""
    metadata, calls = build_metadata([([1], 0, 3)], BS), []

    def make() -> int:
        calls.append(1)
        return len(calls)
    with set_attention_metadata(metadata):
        assert metadata.memo("key", make) == metadata.memo("key", make) == 1
    with set_attention_metadata(metadata):
        assert metadata.memo("key", make) == 2
    assert metadata.memo("key", make) == 3 and metadata.memo("key", make) == 4


def test_a_replaced_metadata_keeps_its_own_memo() -> None:
    """A forward nested in another, over a dataclasses.replace copy of its metadata, leaves the outer one's memo."""
    outer = build_metadata([([1], 0, 3)], BS)
    inner = dataclasses.replace(outer, max_query_len=1)
    with set_attention_metadata(outer):
        assert outer.memo("key", lambda: "outer") == "outer"
        with set_attention_metadata(inner):
            assert inner.memo("key", lambda: "inner") == "inner"
        assert outer.memo("key", lambda: "made again") == "outer"


def test_static_metadata_refilled_in_place_between_forwards_is_read_afresh() -> None:
    """The same metadata object, its tensors rewritten in place between two forwards (as a captured graph's
    buffers are): each forward attends over its own sequences, mixed decode + prefill, not the first one's."""
    gen = torch.Generator().manual_seed(7)
    k_cache, v_cache = torch.randn(16, BS, KV, D, generator=gen), torch.randn(16, BS, KV, D, generator=gen)
    layer = Attention(H, KV, D, SCALE)
    layer.kv_cache = (k_cache, v_cache)
    metadata = build_metadata([([3, 4, 5], 9, 1), ([6, 7], 5, 2)], BS)
    q, k, v = torch.randn(3, H * D, generator=gen), torch.randn(3, KV * D, generator=gen), torch.randn(3, KV * D)
    with set_attention_metadata(metadata):
        layer(q, k, v)
    second = build_metadata([([8, 9, 10], 11, 1), ([11, 12], 4, 2)], BS)
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
        getattr(metadata, name).copy_(getattr(second, name))
    metadata.seq_lens_cpu[:] = second.seq_lens_cpu
    with set_attention_metadata(metadata):
        out = layer(q, k, v)
    expected = torch_ref.paged_attention(q.view(3, H, D), k_cache, v_cache, second, SCALE)  # stored by the call
    torch.testing.assert_close(out, expected.reshape(3, H * D))


def test_store_kv_skips_slot_minus_one() -> None:
    k_cache, v_cache = torch.zeros(3, BS, KV, D), torch.zeros(3, BS, KV, D)
    k, v = torch.randn(3, KV, D), torch.randn(3, KV, D)
    torch_ref.store_kv(k, v, k_cache, v_cache, torch.tensor([5, -1, 8]))
    torch.testing.assert_close(k_cache.view(-1, KV, D)[5], k[0])
    torch.testing.assert_close(v_cache.view(-1, KV, D)[8], v[2])
    assert k_cache.count_nonzero() == k[0].numel() + k[2].numel()  # nothing else was written


def test_bfloat16_output_keeps_dtype() -> None:
    k_cache = torch.zeros(4, BS, KV, D, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    metadata = build_metadata([([1, 2], 0, 6)], BS)
    q, k, v = (torch.randn(6, n, D, dtype=torch.bfloat16) for n in (H, KV, KV))
    out = torch_ref.forward(q, k, v, k_cache, v_cache, metadata, SCALE)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), dense_reference(q.float(), k.float(), v.float()), atol=2e-2, rtol=0)


def test_attention_layer_reads_the_metadata_context() -> None:
    layer = Attention(H, KV, D, SCALE)
    q, k, v = torch.randn(5, H * D), torch.randn(5, KV * D), torch.randn(5, KV * D)
    with pytest.raises(RuntimeError, match="kv_cache is not bound"):
        layer(q, k, v)
    layer.kv_cache = (torch.zeros(4, BS, KV, D), torch.zeros(4, BS, KV, D))
    with pytest.raises(RuntimeError, match="outside set_attention_metadata"):
        layer(q, k, v)
    with set_attention_metadata(build_metadata([([3, 1], 0, 5)], BS)):
        out = layer(q, k, v)
    expected = dense_reference(q.view(5, H, D), k.view(5, KV, D), v.view(5, KV, D))
    torch.testing.assert_close(out, expected.reshape(5, H * D), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"):
        Attention(4, 3, D, SCALE)


def test_backend_registry() -> None:
    assert isinstance(get_attention_backend("auto"), TorchAttentionBackend)
    assert get_attention_backend("torch").name == "torch"
    assert available_attention_backends() == ["auto", "torch", "triton"]
    allowed = r"attention_backend must be one of \['auto', 'torch', 'triton'\], got 'flash'"
    with pytest.raises(ValueError, match=allowed):
        get_attention_backend("flash")

"""Megatron sharding without processes: layers built for rank 0 and rank 1 of a group of two (no communication:
the partial results are combined here, as the all-reduce / all-gather would) reproduce the full layer, loaded
from plain tensors and from lazy safetensors slices alike."""
from __future__ import annotations

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from safetensors import safe_open

from lamina.distributed.parallel_state import SINGLE, TensorParallelGroup, building, current_group
from lamina.layers import embedding as embedding_module
from lamina.layers.embedding import ParallelLMHead, VocabEmbedding
from lamina.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear,
                                  tensor_parallel_rank_and_size)
from lamina.loader.weights import LazySlice

GEN = torch.Generator().manual_seed(0)
RANKS = [TensorParallelGroup(rank, 2) for rank in range(2)]


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN)


def per_rank(make):
    """One module per rank, each built inside building(its group)."""
    modules = []
    for group in RANKS:
        with building(group):
            modules.append(make())
    return modules


@pytest.fixture
def lazy(tmp_path):
    """Save tensors to a safetensors file and hand them back as LazySlices (the loader's TP path)."""
    handles = []

    def make(**tensors: torch.Tensor) -> dict[str, LazySlice]:
        path = tmp_path / f"w{len(handles)}.safetensors"
        safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        handle = safe_open(str(path), framework="pt", device="cpu")
        handles.append(handle)
        return {k: LazySlice.of(handle.get_slice(k)) for k in tensors}
    return make


def test_building_scopes_the_group() -> None:
    assert current_group() is SINGLE and tensor_parallel_rank_and_size() == (0, 1)
    with building(RANKS[1]):
        assert tensor_parallel_rank_and_size() == (1, 2)
    assert tensor_parallel_rank_and_size() == (0, 1)


def test_lazy_slice_reads_only_the_narrowed_part(lazy) -> None:
    full = rand(6, 4)
    sliced = lazy(w=full)["w"].narrow(0, 2, 3).narrow(1, 1, 2)
    assert sliced.shape == (3, 2)
    torch.testing.assert_close(sliced.materialize(), full[2:5, 1:3])
    with pytest.raises(ValueError, match="outside"):
        lazy(w=full)["w"].narrow(0, 5, 2)


@pytest.mark.parametrize("num_kv_heads", [2, 1])  # 1 KV head for 2 ranks: replicated
@pytest.mark.parametrize("from_file", [False, True])
def test_qkv_and_row_parallel_attention_projection(num_kv_heads, from_file, lazy) -> None:
    hidden, head_dim, heads = 32, 8, 4
    q, k, v = rand(heads * head_dim, hidden), rand(num_kv_heads * head_dim, hidden), rand(num_kv_heads * head_dim,
                                                                                         hidden)
    qb, kb, vb = rand(heads * head_dim), rand(num_kv_heads * head_dim), rand(num_kv_heads * head_dim)
    o, ob = rand(hidden, heads * head_dim), rand(hidden)
    weights = dict(q=q, k=k, v=v, qb=qb, kb=kb, vb=vb, o=o, ob=ob)
    weights = lazy(**weights) if from_file else weights
    qkvs = per_rank(lambda: QKVParallelLinear(hidden, head_dim, heads, num_kv_heads, bias=True))
    rows = per_rank(lambda: RowParallelLinear(heads * head_dim, hidden, bias=True))
    for qkv, row in zip(qkvs, rows):
        assert qkv.num_heads == 2 and qkv.num_kv_heads == max(1, num_kv_heads // 2)
        for shard in "qkv":
            qkv.weight.weight_loader(qkv.weight, weights[shard], shard)
            qkv.bias.weight_loader(qkv.bias, weights[shard + "b"], shard)
        row.weight.weight_loader(row.weight, weights["o"])
        row.bias.weight_loader(row.bias, weights["ob"])
    x = rand(3, hidden)
    per_kv = max(1, num_kv_heads // 2) * head_dim
    partial = []
    for rank, (qkv, row) in enumerate(zip(qkvs, rows)):
        q_r, k_r, v_r = qkv.quant_method.apply(qkv, x, qkv.bias).split([2 * head_dim, per_kv, per_kv], dim=-1)
        kv_head = rank if num_kv_heads == 2 else 0
        torch.testing.assert_close(q_r, F.linear(x, q, qb)[:, rank * 2 * head_dim:(rank + 1) * 2 * head_dim])
        torch.testing.assert_close(k_r, F.linear(x, k, kb)[:, kv_head * head_dim:(kv_head + 1) * head_dim])
        torch.testing.assert_close(v_r, F.linear(x, v, vb)[:, kv_head * head_dim:(kv_head + 1) * head_dim])
        partial.append(row.quant_method.apply(row, F.linear(x, q, qb)[:, rank * 16:(rank + 1) * 16], None))
    torch.testing.assert_close(partial[0] + partial[1] + ob, F.linear(F.linear(x, q, qb), o, ob))


def test_merged_column_parallel_gate_up(lazy) -> None:
    gate, up = rand(24, 16), rand(24, 16)
    weights = lazy(gate=gate, up=up)
    layers = per_rank(lambda: MergedColumnParallelLinear(16, [24, 24]))
    x = rand(2, 16)
    for rank, layer in enumerate(layers):
        layer.weight.weight_loader(layer.weight, weights["up"], 1)
        layer.weight.weight_loader(layer.weight, weights["gate"], 0)
        rows = slice(rank * 12, (rank + 1) * 12)
        torch.testing.assert_close(layer(x), torch.cat([x @ gate[rows].T, x @ up[rows].T], -1))


@pytest.mark.parametrize("vocab", [10, 11])  # 11: the last rank's slice is padded
def test_vocab_parallel_embedding_and_head(vocab, lazy, monkeypatch) -> None:
    table, head = rand(vocab, 4), rand(vocab, 4)
    weights = lazy(table=table, head=head)
    embeddings = per_rank(lambda: VocabEmbedding(vocab, 4))
    heads = per_rank(lambda: ParallelLMHead(vocab, 4))
    tied = [per_rank(lambda: ParallelLMHead(vocab, 4, tied_to=e))[i] for i, e in enumerate(embeddings)]
    for emb, lm in zip(embeddings, heads):
        emb.weight.weight_loader(emb.weight, weights["table"])
        lm.weight.weight_loader(lm.weight, weights["head"])
    assert embeddings[1].weight.shape[0] == (6 if vocab == 11 else 5)
    gathered: list[torch.Tensor] = []
    monkeypatch.setattr(embedding_module, "all_reduce", lambda x, group: x)  # per-rank partial sums
    monkeypatch.setattr(embedding_module, "all_gather", lambda x, group, dim: gathered.append(x) or
                        torch.cat([x] * 2, dim))
    ids = torch.tensor([0, 4, 5, 6, vocab - 1, 3])
    torch.testing.assert_close(embeddings[0](ids) + embeddings[1](ids), F.embedding(ids, table))
    hidden = rand(3, 4)
    for lm in heads + tied:
        assert lm.compute_logits(hidden).shape == (3, vocab)
    full_head, full_tied = torch.cat(gathered[:2], -1)[:, :vocab], torch.cat(gathered[2:], -1)[:, :vocab]
    torch.testing.assert_close(full_head, hidden @ head.T)
    torch.testing.assert_close(full_tied, hidden @ table.T)


def test_split_sizes_are_checked() -> None:
    with building(TensorParallelGroup(0, 3)):
        with pytest.raises(ValueError, match="num_attention_heads 4 is not divisible by tensor_parallel_size 3"):
            QKVParallelLinear(12, 4, 4, 2)
    with building(TensorParallelGroup(0, 4)):
        with pytest.raises(ValueError, match="num_key_value_heads 3 and tensor_parallel_size 4"):
            QKVParallelLinear(32, 4, 8, 3)

"""Fused linear layers: shard weight loaders reproduce the separate HF projections; quant methods plug in."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lamina.layers import cpu_matmul
from lamina.layers.cpu_matmul import weight_major_matmul
from lamina.layers.dispatch import CPU_WEIGHT_MAJOR_MAX_ROWS, weight_major_for
from lamina.layers.linear import (LinearBase, MergedColumnParallelLinear, QKVParallelLinear, QuantMethod,
                                  ReplicatedLinear, RowParallelLinear, UnquantizedLinearMethod, small_batch_matmul)

GEN = torch.Generator().manual_seed(0)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN)


def test_qkv_shards_reproduce_separate_projections() -> None:
    layer = QKVParallelLinear(hidden_size=32, head_dim=8, num_heads=4, num_kv_heads=2, bias=True)
    assert layer.weight.shape == (64, 32) and layer.bias.shape == (64,)
    parts = {"q": (rand(32, 32), rand(32)), "k": (rand(16, 32), rand(16)), "v": (rand(16, 32), rand(16))}
    for shard_id in ("v", "q", "k"):  # checkpoint order does not matter
        w, b = parts[shard_id]
        layer.weight.weight_loader(layer.weight, w, shard_id)
        layer.bias.weight_loader(layer.bias, b, shard_id)
    x = rand(5, 32)
    expected = torch.cat([F.linear(x, w, b) for w, b in parts.values()], dim=-1)
    torch.testing.assert_close(layer(x), expected)


def test_merged_column_shards() -> None:
    layer = MergedColumnParallelLinear(16, [24, 24])
    gate, up = rand(24, 16), rand(24, 16)
    layer.weight.weight_loader(layer.weight, up, 1)
    layer.weight.weight_loader(layer.weight, gate, 0)
    x = rand(3, 16)
    torch.testing.assert_close(layer(x), torch.cat([x @ gate.T, x @ up.T], -1))


def test_row_and_replicated() -> None:
    row, rep = RowParallelLinear(16, 8, bias=True), ReplicatedLinear(16, 8)
    w, b = rand(8, 16), rand(8)
    row.weight.weight_loader(row.weight, w)
    row.bias.weight_loader(row.bias, b)
    rep.weight.weight_loader(rep.weight, w)
    x = rand(2, 16)
    torch.testing.assert_close(row(x), F.linear(x, w, b))
    torch.testing.assert_close(rep(x), x @ w.T)


def test_loader_errors_are_clear() -> None:
    layer = QKVParallelLinear(32, 8, 4, 2)
    with pytest.raises(ValueError, match=r"shard_id must be one of \['q', 'k', 'v'\], got 'o'"):
        layer.weight.weight_loader(layer.weight, rand(16, 32), "o")
    with pytest.raises(ValueError, match=r"QKVParallelLinear k: checkpoint tensor has shape \(8, 32\), "
                                         r"the model expects \(16, 32\)"):
        layer.weight.weight_loader(layer.weight, rand(8, 32), "k")
    merged = MergedColumnParallelLinear(16, [24, 24])
    with pytest.raises(ValueError, match=r"shard_id must be one of \[0, 1\], got 2"):
        merged.weight.weight_loader(merged.weight, rand(24, 16), 2)


class TransposedMethod(QuantMethod):
    """A stand-in for a quantized method: its own parameters, a repack after loading, its own apply."""

    def create_weights(self, layer: LinearBase, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        UnquantizedLinearMethod().create_weights(layer, input_size, output_sizes, params_dtype)

    def process_after_loading(self, layer: LinearBase) -> None:
        layer.weight_t = layer.weight.detach().T.contiguous()

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return x @ layer.weight_t + (0 if bias is None else bias)


def test_quant_method_is_delegated_to() -> None:
    layer = MergedColumnParallelLinear(16, [8, 8], quant_method=TransposedMethod())
    gate, up = rand(8, 16), rand(8, 16)
    layer.weight.weight_loader(layer.weight, gate, 0)
    layer.weight.weight_loader(layer.weight, up, 1)
    layer.quant_method.process_after_loading(layer)
    x = rand(2, 16)
    torch.testing.assert_close(layer(x), x @ torch.cat([gate, up]).T)


@pytest.mark.parametrize("lead", [(1,), (3,), (CPU_WEIGHT_MAJOR_MAX_ROWS,), (2, 1), ()])
@pytest.mark.parametrize("with_bias", [False, True])
def test_weight_major_matmul_is_the_linear_layer(lead: tuple[int, ...], with_bias: bool) -> None:
    weight, bias = rand(48, 32), rand(48) if with_bias else None
    x = rand(*lead, 32)
    out = weight_major_matmul(x, weight, bias)
    assert out.shape == (*lead, 48) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, bias))


@pytest.mark.parametrize("faster", [False, True])
def test_small_batch_matmul_takes_the_weight_major_path_where_it_was_measured_faster(
        faster: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    weight = rand(48, 32)
    monkeypatch.setattr(cpu_matmul, "_choices", {(48, 32, rows): faster for rows in cpu_matmul.ROW_BUCKETS})
    assert weight_major_for(rand(1, 32), weight) is faster
    assert weight_major_for(rand(CPU_WEIGHT_MAJOR_MAX_ROWS, 32), weight) is faster
    assert not weight_major_for(rand(CPU_WEIGHT_MAJOR_MAX_ROWS + 1, 32), weight)
    assert not weight_major_for(rand(2, 32).double(), weight.double())
    for rows in (1, 3, CPU_WEIGHT_MAJOR_MAX_ROWS + 4):
        x = rand(rows, 32)
        torch.testing.assert_close(small_batch_matmul(x, weight), F.linear(x, weight))

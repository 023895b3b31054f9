"""The W8A8 runtime on one layer: per-token activation quantization, the int8 GEMM (torch._int_mm, exact
against the float64 reference), LLM.int8()'s outlier decomposition and FP8, each against its formula."""
from __future__ import annotations

import pytest
import torch

from lamina.layers.linear import ReplicatedLinear
from lamina.quant.config import WeightQuantArgs
from lamina.quant.fp8 import Fp8LinearMethod, fp8_quantize
from lamina.quant.fp8 import weight_args as fp8_args
from lamina.quant.llm_int8 import LLMInt8LinearMethod
from lamina.quant.packing import pack_int32
from lamina.quant.rtn import rtn_quantize
from lamina.quant.w8a8 import FP8_MAX, int8_matmul, int8_reference, per_token_fp8, per_token_int8
from lamina.quant.w8a8_int8 import W8A8Int8LinearMethod
from lamina.quant.w8a8_int8 import weight_args as w8a8_args

INT8 = WeightQuantArgs(num_bits=8, symmetric=True, strategy="channel")
K, N = 96, 40


def _weight(seed: int = 0) -> torch.Tensor:
    return torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.1


def _inputs(rows: int = 11, outliers: tuple[int, ...] = ()) -> torch.Tensor:
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(1))
    for col in outliers:
        x[::3, col] = 40.0  # a few tokens, large: LLM.int8()'s emergent outlier features
    return x


def _w8a8_layer(weight: torch.Tensor, method) -> ReplicatedLinear:
    layer = ReplicatedLinear(K, N, bias=True, quant_method=method)
    quantized = (fp8_quantize if isinstance(method, Fp8LinearMethod) else rtn_quantize)(weight, method.args,
                                                                                        torch.float32)
    layer.weight.data.copy_(quantized.q)
    layer.weight_scale.data.copy_(quantized.scale)
    layer.bias.data.copy_(torch.linspace(-1, 1, N))
    return layer


def _llm_int8_layer(weight: torch.Tensor, threshold: float = 6.0) -> ReplicatedLinear:
    layer = ReplicatedLinear(K, N, quant_method=LLMInt8LinearMethod(INT8, threshold))
    quantized = rtn_quantize(weight, INT8, torch.float32)
    layer.weight_packed.data.copy_(pack_int32(quantized.q, 8, dim=1))
    layer.weight_scale.data.copy_(quantized.scale)
    layer.quant_method.process_after_loading(layer)
    return layer


def test_per_token_int8_and_the_exact_int_mm():
    x = _inputs()
    q, scale = per_token_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (11, 1)
    assert torch.equal(q.abs().amax(dim=1), torch.full((11,), 127, dtype=torch.int8))  # each row's max hits 127
    assert (q.float() * scale - x).abs().max() <= scale.max() / 2 + 1e-6
    w = rtn_quantize(_weight(), INT8, torch.float32).q
    for rows in (1, 11, 40):  # _int_mm on the CPU takes any shape
        assert torch.equal(int8_matmul(q[:rows].contiguous(), w), int8_reference(q[:rows], w))


def test_w8a8_int8_layer_is_its_formula():
    layer = _w8a8_layer(_weight(), W8A8Int8LinearMethod(w8a8_args(0)))
    x = _inputs().view(1, 11, K)
    q, scale = per_token_int8(x[0])
    expected = int8_reference(q, layer.weight).double() * scale.double() * layer.weight_scale.double().t()
    torch.testing.assert_close(layer(x)[0], (expected + layer.bias.double()).float(), rtol=1e-6, atol=1e-6)
    dense = x[0] @ _weight().t() + layer.bias
    assert (layer(x)[0] - dense).abs().max() < 0.05  # and close to the float layer


def test_fp8_weights_and_layer():
    weight = _weight()
    quantized = fp8_quantize(weight, fp8_args(0), torch.bfloat16)
    assert quantized.q.dtype == torch.float8_e4m3fn and quantized.scale.dtype == torch.bfloat16
    assert torch.equal(quantized.q.float().abs().amax(dim=1), torch.full((N,), FP8_MAX))
    assert ((quantized.dequantize() - weight).abs() <= weight.abs() / 16 + 1e-3).all()  # 3 mantissa bits
    layer = _w8a8_layer(weight, Fp8LinearMethod(fp8_args(0)))
    x = _inputs()
    x_q, x_scale = per_token_fp8(x)
    assert torch.equal(x_q.float().abs().amax(dim=1), torch.full((11,), FP8_MAX))  # each token's max maps to 448
    expected = (x_q.double() @ layer.weight.double().t()) * x_scale.double() * layer.weight_scale.double().t()
    torch.testing.assert_close(layer(x), (expected + layer.bias.double()).float(), rtol=1e-5, atol=1e-5)


def test_llm_int8_decomposes_outliers():
    weight, outliers = _weight(), (5, 70)
    x = _inputs(outliers=outliers)
    layer = _llm_int8_layer(weight)
    q = layer.weight_int8
    inliers = x.clone()
    inliers[:, list(outliers)] = 0
    x_q, x_scale = per_token_int8(inliers)
    expected = int8_reference(x_q, q).double() * x_scale.double() * layer.weight_scale.double().t()
    w_deq = q.double() * layer.weight_scale.double()
    expected += x[:, list(outliers)].double() @ w_deq[:, list(outliers)].t()
    torch.testing.assert_close(layer(x), expected.float(), rtol=1e-5, atol=1e-5)
    dense = x @ w_deq.float().t()  # the activations' share of the error alone
    plain = _w8a8_layer(weight, W8A8Int8LinearMethod(w8a8_args(0)))
    plain.bias.data.zero_()
    ours, theirs = (layer(x) - dense).abs().mean(), (plain(x) - dense).abs().mean()
    assert ours < 0.25 * theirs, (ours, theirs)  # the outliers no longer crush the other columns' precision


def test_llm_int8_without_outliers_is_w8a8():
    weight, x = _weight(), _inputs()
    plain = _w8a8_layer(weight, W8A8Int8LinearMethod(w8a8_args(0)))
    plain.bias.data.zero_()
    assert torch.equal(_llm_int8_layer(weight, threshold=1e9)(x), plain(x))
    assert not torch.equal(_llm_int8_layer(weight, threshold=1.0)(x), plain(x))


@pytest.mark.parametrize("bad", [0, -2.0])
def test_bad_threshold_is_refused(bad):
    from lamina.quant.compressed_tensors import config_dict
    from lamina.quant.config import parse_quant_config

    with pytest.raises(ValueError, match="threshold: a positive number"):
        parse_quant_config(config_dict(INT8, [], None, bad))

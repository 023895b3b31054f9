"""GPTQ on one layer: it reconstructs the layer's output on its calibration inputs better than RTN; with a
Hessian that couples no columns it is RTN exactly; its integers, scales and zero points are consistent."""
from __future__ import annotations

import pytest
import torch

from lamina.quant.config import WeightQuantArgs
from lamina.quant.rtn import int_range, rtn_quantize
from lamina.quantize.gptq import gptq_quantize, inverse_hessian_factor

ARGS = WeightQuantArgs(num_bits=4, symmetric=False, strategy="group", group_size=64)


def structured_inputs(tokens: int, features: int, seed: int = 0) -> torch.Tensor:
    """Correlated inputs with a few large channels, as a transformer's activations have."""
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(features, features, generator=g) / features ** 0.5
    x = torch.randn(tokens, features, generator=g) @ mixing + 0.1 * torch.randn(tokens, features, generator=g)
    x[:, :4] *= 8.0
    return x


def hessian(x: torch.Tensor) -> torch.Tensor:
    return 2 * x.t() @ x / x.shape[0]


def output_error(x: torch.Tensor, weight: torch.Tensor, quantized: torch.Tensor) -> float:
    return float((x @ (weight - quantized).t()).pow(2).mean())


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group_size", [32, 128])
def test_gptq_output_error_is_lower_than_rtn(act_order, group_size):
    args = WeightQuantArgs(4, False, "group", group_size)
    x = structured_inputs(2048, 256)
    weight = 0.05 * torch.randn(96, 256, generator=torch.Generator().manual_seed(1))
    gptq = gptq_quantize(weight, hessian(x), args, torch.float32, act_order=act_order).dequantize()
    rtn = rtn_quantize(weight, args, torch.float32).dequantize()
    assert output_error(x, weight, gptq) < 0.6 * output_error(x, weight, rtn)


def test_uncoupled_hessian_is_round_to_nearest():
    weight = torch.randn(32, 128, generator=torch.Generator().manual_seed(2))
    gptq = gptq_quantize(weight, 3.0 * torch.eye(128), ARGS, torch.bfloat16)
    rtn = rtn_quantize(weight, ARGS, torch.bfloat16)
    assert torch.equal(gptq.q, rtn.q) and torch.equal(gptq.scale, rtn.scale)
    assert torch.equal(gptq.zero_point, rtn.zero_point)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
def test_integers_scales_and_zero_points_are_consistent(act_order, symmetric):
    args = WeightQuantArgs(4, symmetric, "group", 64)
    weight = 0.02 * torch.randn(48, 192, generator=torch.Generator().manual_seed(3))
    result = gptq_quantize(weight, hessian(structured_inputs(512, 192)), args, torch.bfloat16, act_order=act_order)
    lo, hi = int_range(4)
    assert result.q.dtype == torch.int8 and int(result.q.min()) >= lo and int(result.q.max()) <= hi
    assert result.scale.dtype == torch.bfloat16 and result.scale.shape == (48, 3)
    assert (result.zero_point is None) == symmetric
    assert (result.dequantize() - weight).abs().max() < 3 * result.scale.float().max()


def test_few_tokens_and_dead_inputs_are_handled():
    x = structured_inputs(16, 128)  # rank 16 < 128: singular without dampening
    x[:, 7] = 0.0  # an input that is never active: its weights do not matter
    weight = torch.randn(8, 128, generator=torch.Generator().manual_seed(4))
    result = gptq_quantize(weight, hessian(x), ARGS, torch.float32).dequantize()
    assert torch.isfinite(result).all() and bool((result[:, 7] == 0).all())
    rtn = rtn_quantize(weight, ARGS, torch.float32).dequantize()
    assert output_error(x, weight, result) < output_error(x, weight, rtn)


def test_a_hessian_that_stays_singular_is_a_clear_error():
    with pytest.raises(ValueError, match="model.layers.0.mlp.down_proj: the calibration Hessian is not positive"):
        inverse_hessian_factor(-torch.eye(4), what="model.layers.0.mlp.down_proj")

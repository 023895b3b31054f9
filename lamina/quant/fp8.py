"""FP8 W8A8 (compressed-tensors float-quantized, llm-compressor's FP8_DYNAMIC): fp8 e4m3 weights with one
scale per output channel, fp8 e4m3 activations with one scale per token computed at run time.

    y = (x_q @ w_q^T) * s_x * s_w^T (+ bias)       torch._scaled_mm on sm >= 8.9, the reference path elsewhere

The recipe (`lamina quantize --method fp8`): s_w = max |w_row| / 448, rounded to the checkpoint dtype first,
then w_q = cast_e4m3(w / s_w) (round to nearest even, as torch casts); no calibration data.
"""
from __future__ import annotations

from typing import Any

import torch

from lamina.quant.config import ActivationQuantArgs, WeightQuantArgs
from lamina.quant.recipe import Recipe
from lamina.quant.rtn import QuantizedWeight
from lamina.quant.w8a8 import FP8_DTYPE, FP8_MAX, W8A8LinearMethod, fp8_matmul, per_token_fp8


class Fp8LinearMethod(W8A8LinearMethod):
    weight_dtype = FP8_DTYPE

    def matmul(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        x_q, x_scale = per_token_fp8(x)
        return fp8_matmul(x_q, x_scale, layer.weight, layer.weight_scale, x.dtype)


def fp8_quantize(weight: torch.Tensor, args: WeightQuantArgs, scale_dtype: torch.dtype) -> QuantizedWeight:
    """Per-channel fp8 e4m3 weights (module docstring); scale [rows, 1] in scale_dtype."""
    w = weight.float()
    scale = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).to(scale_dtype)
    q = (w / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return QuantizedWeight(q, scale, None)


def weight_args(group_size: int) -> WeightQuantArgs:
    return WeightQuantArgs(num_bits=8, symmetric=True, strategy="channel", layout="float-quantized", type="float")


RECIPE = Recipe(name="fp8", summary="FP8 W8A8: e4m3 weights per channel, e4m3 activations per token (dynamic)",
                weight_args=weight_args, quantize=fp8_quantize, max_ppl_increase=0.02, max_kl=0.02,
                input_activations=ActivationQuantArgs(type="float"))

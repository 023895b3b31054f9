"""W8A8 int8 (SmoothQuant's and plain W8A8's checkpoints, and llm-compressor's W8A8 / int-quantized ones):
int8 weights with one symmetric scale per output channel, int8 activations with one scale per token,
computed from each token at run time; the product accumulates in int32 (lamina/quant/w8a8.py).

    y = int32(x_q @ w_q^T) * s_x * s_w^T (+ bias)

SmoothQuant's smoothing is already folded into the checkpoint (the norm weights before q/k/v and gate/up):
at run time it is plain W8A8.
"""
from __future__ import annotations

from typing import Any

import torch

from lamina.quant.config import ActivationQuantArgs, WeightQuantArgs
from lamina.quant.recipe import Recipe
from lamina.quant.rtn import rtn_quantize
from lamina.quant.w8a8 import W8A8LinearMethod, int8_matmul, per_token_int8


class W8A8Int8LinearMethod(W8A8LinearMethod):
    weight_dtype = torch.int8

    def matmul(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        x_q, x_scale = per_token_int8(x)
        acc = int8_matmul(x_q, layer.weight)
        return (acc.float() * x_scale * layer.weight_scale.t()).to(x.dtype)


def weight_args(group_size: int) -> WeightQuantArgs:
    return WeightQuantArgs(num_bits=8, symmetric=True, strategy="channel", layout="int-quantized")


# Plain W8A8 by round to nearest, no smoothing: the baseline SmoothQuant is measured against.
RECIPE = Recipe(name="w8a8", summary="W8A8 int8: weights per channel (RTN), activations per token (dynamic)",
                weight_args=weight_args, quantize=rtn_quantize, max_ppl_increase=0.02, max_kl=0.02,
                input_activations=ActivationQuantArgs(type="int"))

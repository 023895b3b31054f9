"""rtn4: W4A16, asymmetric int4 weights with a scale and zero point per group of input columns (128 by
default), by round-to-nearest (lamina/quant/rtn.py): the baseline that GPTQ and AWQ must beat.

Written as compressed-tensors pack-quantized num_bits 4, strategy "group", symmetric false (llm-compressor's
W4A16_ASYM); lamina runs it with lamina/quant/wna16.py.
"""
from __future__ import annotations

from lamina.quant.config import WeightQuantArgs
from lamina.quant.recipe import Recipe
from lamina.quant.rtn import rtn_quantize

DEFAULT_GROUP_SIZE = 128


def weight_args(group_size: int) -> WeightQuantArgs:
    return WeightQuantArgs(num_bits=4, symmetric=False, strategy="group", group_size=group_size)


RECIPE = Recipe(name="rtn4", summary="W4A16: int4 weights, asymmetric, a scale and zero point per group (RTN)",
                weight_args=weight_args, quantize=rtn_quantize, max_ppl_increase=0.05, max_kl=0.1,
                uses_group_size=True)

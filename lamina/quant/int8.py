"""int8: W8A16, per-output-channel symmetric int8 weights by round-to-nearest (lamina/quant/rtn.py).

Written as compressed-tensors pack-quantized num_bits 8, strategy "channel": the layout llm-compressor
writes for W8A16 and vLLM serves through its WNA16 kernels; lamina runs it with lamina/quant/wna16.py.
"""
from __future__ import annotations

from lamina.quant.config import WeightQuantArgs
from lamina.quant.recipe import Recipe
from lamina.quant.rtn import rtn_quantize


def weight_args(group_size: int) -> WeightQuantArgs:
    return WeightQuantArgs(num_bits=8, symmetric=True, strategy="channel")


RECIPE = Recipe(name="int8", summary="W8A16: int8 weights, one symmetric scale per output channel (RTN)",
                weight_args=weight_args, quantize=rtn_quantize, max_ppl_increase=0.01, max_kl=0.01)

"""Offline quantization methods (`lamina quantize --method NAME`): each is a `Recipe` in its own file.

A recipe says which checkpoint scheme it writes (`weight_args`, and `input_activations` for W8A8), how it
turns one weight matrix into integers and scales (`quantize`), what the runtime needs besides (LLM.int8()'s
outlier threshold) and the accuracy budget `lamina quantize` holds it to by default.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lamina.quant.config import ActivationQuantArgs, WeightQuantArgs
from lamina.quant.rtn import QuantizedWeight

# method name -> module holding its RECIPE (imported on first use)
_RECIPES = {"int8": "lamina.quant.int8", "llm_int8": "lamina.quant.llm_int8", "w8a8": "lamina.quant.w8a8_int8",
            "fp8": "lamina.quant.fp8", "rtn4": "lamina.quant.rtn4"}


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str  # one line for --help
    weight_args: Callable[[int], WeightQuantArgs]  # group size -> the scheme written
    quantize: Callable[[torch.Tensor, WeightQuantArgs, torch.dtype], QuantizedWeight]
    max_ppl_increase: float  # default budget: relative perplexity increase, 0.01 = +1 %
    max_kl: float  # default budget: mean KL(unquantized || quantized) per token, nats
    uses_group_size: bool = False
    input_activations: ActivationQuantArgs | None = None  # W8A8: how inputs are quantized at run time
    llm_int8_threshold: float | None = None  # LLM.int8(): written as lamina's marker (compressed_tensors.py)


def method_names() -> list[str]:
    return list(_RECIPES)


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`; ValueError listing the methods otherwise."""
    if name not in _RECIPES:
        raise ValueError(f"method: {name!r} is not supported; supported: {method_names()}")
    return importlib.import_module(_RECIPES[name]).RECIPE

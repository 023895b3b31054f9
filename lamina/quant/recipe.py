"""Offline quantization methods (`lamina quantize --method NAME`): each is a `Recipe` in its own file.

A recipe says which checkpoint scheme it writes (`weight_args`), how it turns one weight matrix into
integers and scales (`quantize`) and the accuracy budget `lamina quantize` holds it to by default.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lamina.quant.config import WeightQuantArgs
from lamina.quant.rtn import QuantizedWeight

# method name -> module holding its RECIPE (imported on first use)
_RECIPES = {"int8": "lamina.quant.int8", "rtn4": "lamina.quant.rtn4"}


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str  # one line for --help
    weight_args: Callable[[int], WeightQuantArgs]  # group size -> the scheme written
    quantize: Callable[[torch.Tensor, WeightQuantArgs, torch.dtype], QuantizedWeight]
    max_ppl_increase: float  # default budget: relative perplexity increase, 0.01 = +1 %
    max_kl: float  # default budget: mean KL(unquantized || quantized) per token, nats
    uses_group_size: bool = False


def method_names() -> list[str]:
    return list(_RECIPES)


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`; ValueError listing the methods otherwise."""
    if name not in _RECIPES:
        raise ValueError(f"method: {name!r} is not supported; supported: {method_names()}")
    return importlib.import_module(_RECIPES[name]).RECIPE

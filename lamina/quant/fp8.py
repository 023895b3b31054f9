"""FP8 W8A8 (compressed-tensors float-quantized, llm-compressor's FP8_DYNAMIC): fp8 e4m3 weights with one
scale per output channel, fp8 e4m3 activations with one scale per token computed at run time.

    y = (x_q @ w_q^T) * s_x * s_w^T (+ bias)       torch._scaled_mm on sm >= 8.9, the reference path elsewhere

Read too (llm-compressor's FP8 scheme): one weight scale per tensor (`weight_scale` [1], spread over the rows of
its shard of a fused layer) and a static input scale per layer (`input_scale` [1]: x_q = e4m3(clamp(x / s_x)),
the same s_x for every token; a fused layer's shards see the same input and take the largest of their scales).

The recipe (`lamina quantize --method fp8`): s_w = max |w_row| / 448, rounded to the checkpoint dtype first,
then w_q = cast_e4m3(w / s_w) (round to nearest even, as torch casts); no calibration data.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from lamina.layers import dispatch
from lamina.layers.linear import set_weight_attrs
from lamina.quant.config import ActivationQuantArgs, WeightQuantArgs
from lamina.quant.recipe import Recipe
from lamina.quant.rtn import QuantizedWeight
from lamina.quant.w8a8 import FP8_DTYPE, FP8_MAX, W8A8LinearMethod, fp8_matmul, per_token_fp8

class Fp8LinearMethod(W8A8LinearMethod):
    weight_dtype = FP8_DTYPE

    def __init__(self, args: WeightQuantArgs, static_input: bool = False) -> None:
        super().__init__(args)
        self.static_input = static_input

    def create_weights(self, layer: Any, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        super().create_weights(layer, input_size, output_sizes, params_dtype)
        if self.args.strategy == "tensor":  # the layer's loader, with the one scale spread over the shard's rows
            layer.weight_scale.weight_loader = functools.partial(self._load_tensor_scale, layer)
        if self.static_input:
            scales = nn.Parameter(torch.zeros(len(output_sizes), dtype=torch.float32), requires_grad=False)
            set_weight_attrs(scales, {"weight_loader": functools.partial(_load_input_scale, layer)})
            layer.register_parameter("input_scale", scales)

    def _load_tensor_scale(self, layer: Any, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        rows = self.output_sizes[layer.shard_index(shard_id)]
        layer.weight_loader(param, _one_scale(loaded, "weight_scale").expand(rows, 1), shard_id)

    def process_after_loading(self, layer: Any) -> None:
        super().process_after_loading(layer)
        if self.static_input:
            scale = layer.input_scale.max()
            if not bool(torch.isfinite(scale) and scale > 0):
                raise ValueError(f"input_scale: positive finite static scales are needed, got "
                                 f"{layer.input_scale.tolist()}")
            layer.static_input_scale = scale.reshape(1, 1)

    def matmul(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        if self.static_input:
            x_q, x_scale = static_fp8(x, layer.static_input_scale)
        else:
            x_q, x_scale = per_token_fp8(x)
        return fp8_matmul(x_q, x_scale, layer.weight, layer.weight_scale, x.dtype,
                          getattr(layer, "kernels", dispatch.DEFAULT_KERNELS))


def static_fp8(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 e4m3 [M, K], scale [M, 1]) with one static scale [1, 1] for every row."""
    x_q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return x_q, scale.expand(x.shape[0], 1)


def _load_input_scale(layer: Any, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
    param.data[layer.shard_index(shard_id)] = _one_scale(loaded, "input_scale")[0, 0]


def _one_scale(loaded: torch.Tensor, name: str) -> torch.Tensor:
    """A per-tensor scale from the checkpoint ([], [1] or [1, 1]) as [1, 1] float32."""
    if loaded.numel() != 1:
        raise ValueError(f"{name}: one scale per tensor was expected, got shape {tuple(loaded.shape)}")
    return loaded.float().reshape(1, 1)


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

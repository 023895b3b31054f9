"""SmoothQuant (Xiao et al., 2023) on one decoder layer: migrate activation outliers into the weights, then
quantize W8A8 (int8 weights per channel, int8 activations per token at run time: lamina/quant/w8a8_int8.py).

For a norm and the linears that read its output (llm-compressor's SmoothQuantModifier mappings for Llama):

    input_layernorm           -> qkv_proj      (q_proj, k_proj, v_proj)
    post_attention_layernorm  -> gate_up_proj  (gate_proj, up_proj)

    s_j = max|X_j|^α / max|W_j|^(1-α)       X_j: input channel j over the calibration tokens,
                                              W_j: column j over every row of the linears (α: --alpha, 0.5)
    norm.weight_j / s_j,   W[:, j] * s_j     the float model computes the same function

The folded norm weight is rounded to the checkpoint dtype at once, and the columns are multiplied by
old / rounded norm weight, so the fold stays exact for what the checkpoint holds. The weights are then
quantized by round to nearest (one symmetric scale per output row); o_proj and down_proj, which have no
norm before them, are quantized without smoothing, as in llm-compressor. Layer L is calibrated on what the
already-quantized layers 0 .. L-1 produce (lamina/quantize/calibrate.py).
"""
from __future__ import annotations

import torch
from torch import nn

from lamina.quant.config import WeightQuantArgs
from lamina.quant.rtn import QuantizedWeight, rtn_quantize
from lamina.quantize.calibrate import LINEARS, Calibrated, CalibrationOptions, record_float, record_quantized
from lamina.quantize.layerwise import InputStats, LayerwiseRunner

QKV, _, GATE_UP, _ = LINEARS
MAPPINGS = (("input_layernorm", QKV), ("post_attention_layernorm", GATE_UP))
_EPS = 1e-5


def smoothing_scales(act_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """s [in] from the inputs' max |x| per channel [in] and the weight [out, in] (module docstring)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"--alpha must be within [0, 1], got {alpha}")
    w_max = weight.abs().amax(dim=0).float().clamp(min=_EPS)
    scales = act_max.float().clamp(min=_EPS).pow(alpha) / w_max.pow(1.0 - alpha)
    return scales.clamp(min=_EPS)


@torch.no_grad()
def smooth(norm: nn.Module, linear: nn.Module, act_max: torch.Tensor, alpha: float, dtype: torch.dtype) -> None:
    """Fold the smoothing scales into `norm`'s weight (rounded to dtype) and `linear`'s columns."""
    s = smoothing_scales(act_max, linear.weight, alpha)
    old = norm.weight.detach().clone()
    new = (old / s).to(dtype).float()
    effective = torch.where(new != 0, old / new, s)
    norm.weight.copy_(new)
    linear.weight.mul_(effective[None, :])


@torch.no_grad()
def smoothquant_layer(runner: LayerwiseRunner, layer: nn.Module, prefix: str, targets: dict[str, WeightQuantArgs],
                      options: CalibrationOptions, result: Calibrated) -> None:
    """Smooth, then quantize the layer's targeted linears (module docstring); the state moves on."""
    mapped = [(norm, linear) for norm, linear in MAPPINGS if f"{prefix}.{linear}" in targets]
    stats = {linear: InputStats(layer.get_submodule(linear).input_size) for _, linear in mapped}
    if stats:
        runner.capture(layer, stats)
    for norm, linear in mapped:
        smooth(layer.get_submodule(norm), layer.get_submodule(linear), stats[linear].abs_max, options.alpha,
               options.scale_dtype)
        record_float(result, runner.model, f"{prefix}.{norm}.weight")
    for linear in LINEARS:
        name = f"{prefix}.{linear}"
        if name in targets:
            weight = layer.get_submodule(linear).weight
            record_quantized(result, runner.model, name, rtn_quantize(weight, targets[name], options.scale_dtype))
    result.notes[prefix] = f"α={options.alpha:g}, smoothed: {', '.join(norm for norm, _ in mapped) or 'none'}"
    runner.advance(layer)


def smoothquant_head(weight: torch.Tensor, stats: InputStats, args: WeightQuantArgs,
                     options: CalibrationOptions) -> QuantizedWeight:
    """The LM head: W8A8 by round to nearest (its input's scale would fold into the final norm)."""
    return rtn_quantize(weight.detach(), args, options.scale_dtype)


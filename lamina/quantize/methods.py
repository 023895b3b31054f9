"""The calibrated methods of `lamina quantize`: gptq, awq (W4A16) and smoothquant (W8A8 int8).

gptq and awq write what rtn4 writes (W4A16: int4 weights, asymmetric, a scale and zero point per group of 128 input
columns, compressed-tensors pack-quantized), are held to rtn4's budgets, and must also beat rtn4 itself on
perplexity (the gate in cli.py quantizes with rtn4 as well and compares). They differ in how the integers
are chosen, from calibration data: GPTQ (lamina/quantize/gptq.py) compensates rounding errors through the
Hessian of each layer's inputs; AWQ (lamina/quantize/awq.py, awq_layer.py) rescales input channels by
their activation magnitude and clips weight ranges. smoothquant (lamina/quantize/smoothquant.py) writes
what w8a8 writes, held to w8a8's budgets, after migrating activation outliers into the weights; its table
shows w8a8 (plain W8A8, round to nearest) beside it, for comparison only.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from safetensors import safe_open

from lamina.loader.weights import safetensors_files
from lamina.quant.compressed_tensors import QUANT_METHOD
from lamina.quant.config import QuantConfig, QuantScheme, WeightQuantArgs
from lamina.quant.recipe import Recipe, get_recipe, method_names
from lamina.quant.rtn import QuantizedWeight
from lamina.quantize.awq_layer import awq_head, awq_layer
from lamina.quantize.calibrate import CalibrationOptions, HeadMethod, LayerMethod, calibrate, gptq_head, gptq_layer
from lamina.quantize.smoothquant import smoothquant_head, smoothquant_layer
from lamina.quantize.writer import LINEAR_MODULES, QuantizeResult, quantize_checkpoint


@dataclass(frozen=True)
class CalibratedMethod:
    recipe: Recipe
    layer: LayerMethod
    head: HeadMethod
    baseline: str = "rtn4"  # the method evaluated beside it (the gate's reference column)
    must_beat: bool = True  # refuse a result whose perplexity is not below the baseline's
    takes_act_order: bool = False
    takes_alpha: bool = False


def calibration_only(name: str):
    def quantize(weight: torch.Tensor, args: WeightQuantArgs, dtype: torch.dtype) -> QuantizedWeight:
        raise ValueError(f"{name} needs calibration data; run it through lamina.quantize.methods.quantize_calibrated")
    return quantize


def _recipe(name: str, summary: str) -> Recipe:
    rtn4 = get_recipe("rtn4")
    return Recipe(name=name, summary=summary, weight_args=rtn4.weight_args, quantize=calibration_only(name),
                  max_ppl_increase=rtn4.max_ppl_increase, max_kl=rtn4.max_kl, uses_group_size=True)


SMOOTHQUANT = dataclasses.replace(get_recipe("w8a8"), name="smoothquant", quantize=calibration_only("smoothquant"),
                                  summary="W8A8 int8 as w8a8, SmoothQuant: activation outliers migrated into the "
                                          "weights (--alpha)")


CALIBRATED = {
    "gptq": CalibratedMethod(_recipe("gptq", "W4A16 as rtn4, GPTQ: rounding errors compensated through the "
                                             "inputs' Hessian"), gptq_layer, gptq_head, takes_act_order=True),
    "awq": CalibratedMethod(_recipe("awq", "W4A16 as rtn4, AWQ: activation-aware channel scales and clipping"),
                            awq_layer, awq_head),
    # w8a8 is shown beside it, not a bar to clear: on the demo model (no strong outlier channels) the two are
    # within 0.02 % perplexity of each other (docs/quantization.md)
    "smoothquant": CalibratedMethod(SMOOTHQUANT, smoothquant_layer, smoothquant_head, baseline="w8a8",
                                    must_beat=False, takes_alpha=True),
}


def all_method_names() -> list[str]:
    return method_names() + list(CALIBRATED)


def checkpoint_dtype(model_dir: str) -> torch.dtype:
    """The dtype of the checkpoint's first linear weight: quantization scales are stored in it."""
    for file in safetensors_files(model_dir):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name.endswith(".weight") and name.rpartition(".")[0].rpartition(".")[2] in LINEAR_MODULES:
                    return f.get_slice(name)[:1].dtype
    raise ValueError(f"model: {model_dir!r} has no linear weight to quantize")


def quantize_calibrated(model_dir: str, output_dir: str, method: CalibratedMethod, group_size: int,
                        ignore: tuple[str, ...], sequences: list[list[int]], act_order: bool = False,
                        progress: bool = True, alpha: float | None = None) -> tuple[QuantizeResult, dict[str, str]]:
    """Calibrate `method` on `sequences` (token ids) and write the checkpoint into `output_dir`; returns what
    was written (its seconds include the calibration) and the method's notes per layer."""
    if act_order and not method.takes_act_order:
        raise ValueError(f"--act-order: {method.recipe.name} has no activation order (gptq only)")
    if alpha is not None and not method.takes_alpha:
        raise ValueError(f"--alpha: {method.recipe.name} has no migration strength (smoothquant only)")
    start = time.perf_counter()
    args = method.recipe.weight_args(group_size)
    config = QuantConfig(QUANT_METHOD, (QuantScheme(("Linear",), args, method.recipe.input_activations),),
                         tuple(ignore))
    options = CalibrationOptions(scale_dtype=checkpoint_dtype(model_dir), act_order=act_order,
                                 **({} if alpha is None else {"alpha": alpha}))
    calibrated = calibrate(model_dir, config, sequences, method.layer, method.head, options, progress,
                           desc=f"calibrate ({method.recipe.name})")
    done = quantize_checkpoint(model_dir, output_dir, method.recipe, group_size, ignore, progress, calibrated)
    return dataclasses.replace(done, seconds=time.perf_counter() - start), calibrated.notes

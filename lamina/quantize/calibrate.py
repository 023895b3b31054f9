"""Calibrated quantization (GPTQ, AWQ, SmoothQuant) of a whole model, decoder layer by decoder layer.

    load MODEL in float32 (lamina's own model, CPU)
    for each decoder layer L, in order (lamina/quantize/layerwise.py):
        the method calibrates L's targeted linears on inputs from the already-quantized layers 0 .. L-1,
        writes each dequantized result back into the model, and moves the state through L
    the LM head last, when it is targeted (untied and not in --ignore)

The result is keyed by checkpoint names: each fused lamina linear (qkv_proj, gate_up_proj) is split back
into its checkpoint modules by rows. `tensors` holds float tensors that replace the checkpoint's (AWQ
folds its scales into RMSNorm weights, biases and unquantized linears).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm import tqdm

from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.models.common import CausalLM
from lamina.quant.config import QuantConfig, WeightQuantArgs, shard_names
from lamina.quant.rtn import QuantizedWeight
from lamina.quantize.gptq import gptq_quantize
from lamina.quantize.layerwise import InputStats, LayerwiseRunner

# A decoder layer's linears in forward order (lamina module names, relative to the layer).
LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


@dataclass(frozen=True)
class CalibrationOptions:
    scale_dtype: torch.dtype  # the checkpoint's dtype: scales are stored (and rounded) in it
    act_order: bool = False  # GPTQ only
    alpha: float = 0.5  # SmoothQuant's migration strength


@dataclass
class Calibrated:
    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)  # checkpoint module -> weight
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # checkpoint tensor -> float replacement
    notes: dict[str, str] = field(default_factory=dict)  # per layer, for the summary (AWQ's chosen α)
    actorder: str | None = None  # compressed-tensors `actorder` of the scheme written ("static": GPTQ act-order)


# (runner, layer, its prefix, targeted lamina names -> args, options, result) -> None
LayerMethod = Callable[[LayerwiseRunner, nn.Module, str, dict[str, WeightQuantArgs], CalibrationOptions,
                        Calibrated], None]
HeadMethod = Callable[[torch.Tensor, InputStats, WeightQuantArgs, CalibrationOptions], QuantizedWeight]


def targets_of(model: CausalLM, config: QuantConfig) -> dict[str, WeightQuantArgs]:
    """lamina module name -> weight args of every linear `config` quantizes (decoder linears, LM head)."""
    names = [f"model.layers.{i}.{linear}" for i in range(len(model.model.layers)) for linear in LINEARS]
    if not model.arch.tie_word_embeddings:
        names.append("lm_head")
    targets = {}
    for name in names:
        args = config.scheme_for("Linear", shard_names(name))
        if args is not None:
            targets[name] = args
    return targets


def record_quantized(result: Calibrated, model: nn.Module, name: str, weight: QuantizedWeight) -> None:
    """Write the dequantized weight into `name`'s module and keep its integers under checkpoint names."""
    module = model.get_submodule(name)
    with torch.no_grad():
        module.weight.copy_(weight.dequantize())
    sizes = getattr(module, "output_sizes", [weight.q.shape[0]])
    parts = zip(weight.q.split(sizes), weight.scale.split(sizes),
                weight.zero_point.split(sizes) if weight.zero_point is not None else [None] * len(sizes))
    for shard, (q, scale, zero_point) in zip(shard_names(name), parts):
        result.quantized[shard] = QuantizedWeight(q.contiguous(), scale.contiguous(),
                                                  None if zero_point is None else zero_point.contiguous())


def record_float(result: Calibrated, model: nn.Module, name: str) -> None:
    """Keep the parameter `name` (e.g. a norm weight AWQ changed) as checkpoint tensors, fused ones split."""
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    tensor = getattr(module, leaf).detach()
    shards = shard_names(module_name)
    parts = tensor.split(module.output_sizes) if len(shards) > 1 else [tensor]
    for shard, part in zip(shards, parts):
        result.tensors[f"{shard}.{leaf}"] = part.clone()


def gptq_layer(runner: LayerwiseRunner, layer: nn.Module, prefix: str, targets: dict[str, WeightQuantArgs],
               options: CalibrationOptions, result: Calibrated) -> None:
    """GPTQ on each targeted linear of the layer in forward order, each on inputs produced by the linears
    before it already quantized (the reference's --true-sequential), then the state moves on."""
    for linear in LINEARS:
        name = f"{prefix}.{linear}"
        if name not in targets:
            continue
        module = layer.get_submodule(linear)
        stats = {linear: InputStats(module.input_size, hessian=True)}
        runner.capture(layer, stats)
        weight = gptq_quantize(module.weight, stats[linear].hessian(), targets[name], options.scale_dtype,
                               options.act_order, what=name)
        record_quantized(result, runner.model, name, weight)
    runner.advance(layer)


def gptq_head(weight: torch.Tensor, stats: InputStats, args: WeightQuantArgs,
              options: CalibrationOptions) -> QuantizedWeight:
    return gptq_quantize(weight, stats.hessian(), args, options.scale_dtype, options.act_order, what="lm_head")


def load_float_model(model_dir: str) -> CausalLM:
    arch = load_model_arch(model_dir)
    return load_model(model_dir, arch, torch.float32, "cpu", attention_backend="torch")


def calibrate(model_dir: str, config: QuantConfig, sequences: list[list[int]], layer_method: LayerMethod,
              head_method: HeadMethod, options: CalibrationOptions, progress: bool = True,
              desc: str = "calibrate") -> Calibrated:
    """Quantize every linear of `model_dir` that `config` targets with a calibrated method (module docstring)."""
    model = load_float_model(model_dir)
    targets = targets_of(model, config)
    runner = LayerwiseRunner(model, sequences)
    result = Calibrated(actorder="static" if options.act_order else None)
    layers = model.model.layers
    for index, layer in enumerate(tqdm(layers, desc=desc, unit="layer", disable=not progress)):
        layer_method(runner, layer, f"model.layers.{index}", targets, options, result)
    if "lm_head" in targets:
        stats = InputStats(model.arch.hidden_size, hessian=True, max_samples=4096, total_tokens=runner.total_tokens)
        for hidden in runner.final_hidden():
            stats.add(hidden)
        record_quantized(result, model, "lm_head", head_method(model.lm_head.weight, stats, targets["lm_head"],
                                                               options))
    return result

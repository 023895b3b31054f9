"""AWQ on one decoder layer: search per-channel scales, fold them into the ops before, clip, quantize.

The scales are folded where the algebra is exact (the float model's output does not change):

    input_layernorm.weight / s        ->  qkv_proj.weight * s        (columns)
    post_attention_layernorm.weight / s  ->  gate_up_proj.weight * s  (columns)
    v_proj rows (and bias) / s        ->  o_proj.weight * s[expand]  (columns; under grouped-query attention
                                                                      one v channel feeds `group` o_proj columns)
    up_proj rows / s                  ->  down_proj.weight * s        (columns; silu(gate) * up is linear in up)

A folded norm weight is rounded to the checkpoint dtype at once, so the layers after calibrate on what the
checkpoint will hold. A scale is searched only for a targeted (quantized) linear. The clipping search
skips q and k rows (their errors pass through the softmax; AutoAWQ skips them too).
"""
from __future__ import annotations

import torch
from torch import nn

from lamina.quant.config import WeightQuantArgs
from lamina.quant.rtn import QuantizedWeight, rtn_quantize
from lamina.quantize.awq import search_clip, search_scale
from lamina.quantize.calibrate import LINEARS, Calibrated, CalibrationOptions, record_float, record_quantized
from lamina.quantize.layerwise import InputStats, LayerwiseRunner

SEARCH_TOKENS = 4096  # calibration tokens kept per linear for the searches (every k-th token)
QKV, O_PROJ, GATE_UP, DOWN = LINEARS


def _kv_expand(attn: nn.Module) -> torch.Tensor:
    """For each o_proj input column (query head h, dim d), the v channel it reads: (h // group) * hd + d."""
    qkv = attn.qkv_proj
    group, hd = qkv.num_heads // qkv.num_kv_heads, qkv.head_dim
    column = torch.arange(qkv.num_heads * hd)
    return (column // hd // group) * hd + column % hd


def _v_rows(attn: nn.Module) -> slice:
    q, kv = attn.q_size, attn.kv_size
    return slice(q + kv, q + 2 * kv)


class _Folder:
    """Scale searches and folds for one layer, with what it changed (lamina parameter names)."""

    def __init__(self, layer: nn.Module, prefix: str, targets: dict[str, WeightQuantArgs],
                 options: CalibrationOptions, stats: dict[str, InputStats]) -> None:
        self.layer, self.prefix, self.targets, self.options = layer, prefix, targets, options
        self.x = {name: s.samples() for name, s in stats.items()}
        self.mean_abs = {name: s.mean_abs() for name, s in stats.items()}
        self.changed: set[str] = set()
        self.alphas: dict[str, float] = {}

    def targeted(self, linear: str) -> bool:
        return f"{self.prefix}.{linear}" in self.targets

    def _search(self, linear: str, mean_abs: torch.Tensor, expand: torch.Tensor | None = None) -> torch.Tensor:
        args = self.targets[f"{self.prefix}.{linear}"]
        weight = self.layer.get_submodule(linear).weight
        s, self.alphas[linear] = search_scale(self.x[linear], mean_abs, weight, args, self.options.scale_dtype,
                                              expand)
        full = s if expand is None else s[expand]
        weight.mul_(full[None, :])
        self.x[linear] /= full
        return s

    def norm_to_linear(self, norm: str, linear: str) -> None:
        if not self.targeted(linear):
            return
        s = self._search(linear, self.mean_abs[linear])
        weight = self.layer.get_submodule(norm).weight
        weight.copy_((weight / s).to(self.options.scale_dtype).float())
        self.changed.add(f"{norm}.weight")

    def rows_to_linear(self, source: str, rows: slice, linear: str, expand: torch.Tensor | None = None) -> None:
        """Scale `linear`'s input channels by s and divide the `rows` of the linear `source` that produce them."""
        if not self.targeted(linear):
            return
        mean_abs = self.mean_abs[linear]
        if expand is not None:  # the mean over the query heads sharing a KV head
            mean_abs = torch.zeros(int(expand.max()) + 1).index_add_(0, expand, mean_abs) / expand.bincount()
        s = self._search(linear, mean_abs, expand)
        module = self.layer.get_submodule(source)
        module.weight[rows] /= s[:, None]
        if module.bias is not None:
            module.bias[rows] /= s
            self.changed.add(f"{source}.bias")
        if not self.targeted(source):
            self.changed.add(f"{source}.weight")


def _clip_and_quantize(folder: _Folder, linear: str) -> tuple[str, QuantizedWeight]:
    name = f"{folder.prefix}.{linear}"
    args, weight = folder.targets[name], folder.layer.get_submodule(linear).weight.detach().clone()
    rows = _v_rows(folder.layer.self_attn) if linear == QKV else slice(None)
    weight[rows] = search_clip(folder.x[linear], weight[rows], args, folder.options.scale_dtype)
    return name, rtn_quantize(weight, args, folder.options.scale_dtype)


@torch.no_grad()
def awq_layer(runner: LayerwiseRunner, layer: nn.Module, prefix: str, targets: dict[str, WeightQuantArgs],
              options: CalibrationOptions, result: Calibrated) -> None:
    """AWQ on one decoder layer (module docstring), then the state moves through the quantized layer."""
    stats = {linear: InputStats(layer.get_submodule(linear).input_size, max_samples=SEARCH_TOKENS,
                                total_tokens=runner.total_tokens) for linear in LINEARS}
    runner.capture(layer, stats, stop_early=False)
    folder = _Folder(layer, prefix, targets, options, stats)
    attn, mlp = layer.self_attn, layer.mlp
    folder.norm_to_linear("input_layernorm", QKV)
    folder.rows_to_linear(QKV, _v_rows(attn), O_PROJ, _kv_expand(attn))
    folder.norm_to_linear("post_attention_layernorm", GATE_UP)
    intermediate = mlp.gate_up_proj.output_sizes[0]
    folder.rows_to_linear(GATE_UP, slice(intermediate, 2 * intermediate), DOWN)
    for linear in LINEARS:
        if folder.targeted(linear):
            record_quantized(result, runner.model, *_clip_and_quantize(folder, linear))
    for name in folder.changed:
        record_float(result, runner.model, f"{prefix}.{name}")
    result.notes[prefix] = ", ".join(f"{linear.rpartition('.')[2]} α={alpha:.2f}"
                                     for linear, alpha in folder.alphas.items())
    runner.advance(layer)


def awq_head(weight: torch.Tensor, stats: InputStats, args: WeightQuantArgs,
             options: CalibrationOptions) -> QuantizedWeight:
    """The LM head: clipping only (its input's scale would fold into the final norm, which every token reads)."""
    return rtn_quantize(search_clip(stats.samples(), weight.detach(), args, options.scale_dtype), args,
                        options.scale_dtype)

"""Write a quantized checkpoint: every linear weight of a HF checkpoint through a `Recipe`, the rest copied.

    MODEL/ (config.json, *.safetensors, tokenizer files, ...)
      -> OUT/config.json            MODEL's, plus quantization_config (compressed-tensors)
         OUT/model.safetensors      quantized linears as X.weight_packed / weight_scale / ..., other tensors as is
         OUT/<side files>           tokenizer, generation config, chat template (not README.md: it describes MODEL)

The linears are the Llama-family projections lamina loads (q/k/v/o_proj, gate/up/down_proj) and the LM head,
minus `ignore` (compressed-tensors target syntax; default: lm_head, as llm-compressor does).
Calibrated methods (GPTQ, AWQ: lamina/quantize/calibrate.py) hand their integers and scales over in a
`Calibrated`, with the float tensors they changed (AWQ's folded norm weights); the rest is the same.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from lamina.loader.hf_config import load_model_arch
from lamina.loader.weights import iterate_weights, safetensors_files
from lamina.quant.compressed_tensors import QUANT_METHOD, compressed_tensors_of, config_dict
from lamina.quant.config import QuantConfig, QuantScheme, WeightQuantArgs
from lamina.quant.recipe import Recipe
from lamina.quant.rtn import QuantizedWeight

if TYPE_CHECKING:
    from lamina.quantize.calibrate import Calibrated

LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
DEFAULT_IGNORE = ("lm_head",)
WEIGHT_FILE = "model.safetensors"
_NOT_COPIED = ("config.json", "README.md", "model.safetensors.index.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class QuantizeResult:
    args: WeightQuantArgs
    quantized: list[str]  # checkpoint names of the quantized weights
    bytes_before: int
    bytes_after: int
    seconds: float


def _checkpoint_names(model_dir: str) -> list[str]:
    names: list[str] = []
    for file in safetensors_files(model_dir):
        with safe_open(str(file), framework="pt") as f:
            names.extend(f.keys())
    return names


def _targets(names: list[str], config: QuantConfig, tied: bool) -> set[str]:
    """The checkpoint weights that `config` quantizes."""
    targets = set()
    for name in names:
        prefix, _, leaf = name.rpartition(".")
        if leaf != "weight" or prefix.rpartition(".")[2] not in LINEAR_MODULES:
            continue
        if tied and prefix == "lm_head":  # lamina (and HF) use the embedding instead
            continue
        if config.scheme_for("Linear", [prefix]) is not None:
            targets.add(name)
    return targets


def _quantize_one(name: str, weight: torch.Tensor, recipe: Recipe, args: WeightQuantArgs,
                  calibrated: Calibrated | None = None) -> dict[str, torch.Tensor]:
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"{name}: expected a 2-D float weight, got {tuple(weight.shape)} {weight.dtype}")
    prefix = name.rpartition(".")[0]
    if calibrated is not None:
        packed = _calibrated_one(name, weight, calibrated)
    else:
        try:
            packed = recipe.quantize(weight, args, weight.dtype)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return {f"{prefix}.{suffix}": t for suffix, t in
            compressed_tensors_of(packed.q, packed.scale, packed.zero_point, args).items()}


def _calibrated_one(name: str, weight: torch.Tensor, calibrated: Calibrated) -> QuantizedWeight:
    packed = calibrated.quantized.get(name.rpartition(".")[0])
    if packed is None:
        raise ValueError(f"{name}: the calibration quantized no such layer")
    if tuple(packed.q.shape) != tuple(weight.shape):
        raise ValueError(f"{name}: calibrated integers {tuple(packed.q.shape)} do not match the weight "
                         f"{tuple(weight.shape)}")
    return packed


def _copy_side_files(model_dir: Path, output_dir: Path) -> None:
    for path in sorted(model_dir.iterdir()):
        if path.is_file() and path.name not in _NOT_COPIED and not path.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(path, output_dir / path.name)


def quantize_checkpoint(model_dir: str, output_dir: str, recipe: Recipe, group_size: int,
                        ignore: tuple[str, ...] = DEFAULT_IGNORE, progress: bool = True,
                        calibrated: Calibrated | None = None) -> QuantizeResult:
    """Quantize `model_dir` with `recipe` (or take `calibrated`'s results) into `output_dir` (created; must not
    hold a checkpoint already)."""
    start = time.perf_counter()
    arch = load_model_arch(model_dir)
    if arch.raw.get("quantization_config"):
        raise ValueError(f"model: {model_dir!r} is already quantized (its config.json has a quantization_config)")
    args = recipe.weight_args(group_size)
    config = QuantConfig(QUANT_METHOD, (QuantScheme(("Linear",), args, recipe.input_activations),), tuple(ignore))
    targets = _targets(_checkpoint_names(model_dir), config, arch.tie_word_embeddings)
    tensors: dict[str, torch.Tensor] = {}
    before = 0
    replaced = {} if calibrated is None else calibrated.tensors
    desc = f"{'pack' if calibrated else 'quantize'} ({recipe.name})"
    with tqdm(total=len(targets), desc=desc, unit="layer", disable=not progress) as bar:
        for name, tensor in iterate_weights(model_dir):
            before += tensor.numel() * tensor.element_size()
            if name in targets:
                tensors.update(_quantize_one(name, tensor, recipe, args, calibrated))
                bar.update()
            else:
                tensors[name] = replaced[name].to(tensor.dtype) if name in replaced else tensor
                tensors[name] = tensors[name].contiguous()
    unused = set(replaced) - set(tensors)
    if unused:
        raise ValueError(f"calibration changed tensors the checkpoint does not have: {sorted(unused)[:5]}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHT_FILE), metadata={"format": "pt"})
    _copy_side_files(Path(model_dir), out)
    quantization_config = config_dict(args, list(ignore), recipe.input_activations, recipe.llm_int8_threshold)
    if calibrated is not None and calibrated.actorder:
        quantization_config["config_groups"]["group_0"]["weights"]["actorder"] = calibrated.actorder
    raw = {**arch.raw, "quantization_config": quantization_config}
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    after = sum(t.numel() * t.element_size() for t in tensors.values())
    return QuantizeResult(args, sorted(targets), before, after, time.perf_counter() - start)

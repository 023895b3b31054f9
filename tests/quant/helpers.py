"""Shared pieces of the quantization tests: a tiny model whose layers hold several scale groups, lamina's
and transformers' logits, and a checkpoint rewritten with dequantized weights (the exact reference)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.quant.config import shard_names
from lamina.quantize.writer import quantize_checkpoint
from lamina.quant.recipe import get_recipe
from tests.helpers.paged import PagedRunner
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer

GROUP = 64  # hidden 128, intermediate 256: 2 and 4 groups per row
QUANT_TENSORS = ("weight", "weight_packed", "weight_scale", "weight_zero_point", "weight_shape")
PROMPTS = {"a": [5, 17, 33, 101, 7, 250, 3, 9, 44], "b": [1, 2, 3], "c": [299, 12, 99, 99, 8, 61]}


def tiny_model(path: Path, kind: str = "llama", **overrides: object) -> Path:
    """A tiny random checkpoint with a tokenizer; hidden 128 and intermediate 256 so groups of 64 fit."""
    shape = dict(hidden_size=128, intermediate_size=256, head_dim=32, vocab_size=320)
    make_tiny_model(kind, path, **{**shape, **overrides})
    save_tiny_tokenizer(path, vocab_size=300)
    return path


def quantized(source: Path, out: Path, method: str, group_size: int = GROUP, ignore: tuple = ("lm_head",)) -> Path:
    quantize_checkpoint(str(source), str(out), get_recipe(method), group_size, ignore, progress=False)
    return out


def load(model_dir: str | Path, dtype: torch.dtype = torch.float32):
    return load_model(str(model_dir), load_model_arch(str(model_dir)), dtype, "cpu", attention_backend="torch")


def lamina_logits(model_dir: str | Path, prompts: dict[str, list[int]] = PROMPTS) -> dict[str, torch.Tensor]:
    """Logits of every prompt position, all prompts in one flat batch."""
    model = load(model_dir)
    return PagedRunner(model, load_model_arch(str(model_dir)), num_blocks=32).step(prompts)


def hf_logits(model_dir: str | Path, prompts: dict[str, list[int]] = PROMPTS) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return {k: model(torch.tensor([ids])).logits[0].float() for k, ids in prompts.items()}


def dequantized_weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Checkpoint module name -> the float32 weight lamina computes with (fused layers split back)."""
    model = load(model_dir)
    weights = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or not hasattr(method, "dequantized_weight"):
            continue
        full = method.dequantized_weight(module)
        for shard, rows in zip(shard_names(name), full.split(method.output_sizes)):
            weights[shard] = rows
    return weights


def dequantized_checkpoint(model_dir: Path, out: Path) -> Path:
    """The quantized checkpoint with every quantized linear replaced by its dequantized float32 weight."""
    out.mkdir(parents=True)
    weights = dequantized_weights(model_dir)
    tensors = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items()
               if not (k.rpartition(".")[0] in weights and k.rpartition(".")[2] in QUANT_TENSORS)}
    tensors.update({f"{name}.weight": w.contiguous() for name, w in weights.items()})
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(config))
    return out

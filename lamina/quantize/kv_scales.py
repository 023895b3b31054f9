"""`lamina quantize --kv-cache-scheme fp8`: static fp8 KV scales measured on the calibration text, written as
compressed-tensors' `kv_cache_scheme` (what llm-compressor writes, and vLLM, transformers and lamina read):

    config.json   quantization_config.kv_cache_scheme = {"num_bits": 8, "type": "float", "strategy": "attn_head",
                                                          "dynamic": false, "symmetric": true, ...}
    weights       model.layers.N.self_attn.k_scale / v_scale   float32 [num_kv_heads, 1, 1]

The scales are measured on the checkpoint as written (its quantized linears included: the K / V that will be
cached), with the same rule as the engine's start-up measurement (lamina/kv/fp8_scales.py), but over real text.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lamina.attention.layer import Attention
from lamina.kv.fp8_scales import measure_kv_scales
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.quantize.writer import WEIGHT_FILE

KV_CACHE_SCHEMES = ("fp8",)
KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "attn_head", "dynamic": False, "symmetric": True,
                   "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
                   "observer_kwargs": {}}

KV_ONLY = {"quant_method": "compressed-tensors", "format": "dense", "quantization_status": "compressed",
           "config_groups": {}, "ignore": [], "sparsity_config": {}, "transform_config": {}}


def add_kv_scales(checkpoint_dir: str, sequences: list[list[int]], progress: bool = False) -> int:
    """Measure the per-head scales of the checkpoint in `checkpoint_dir` over `sequences` and write them into it
    (`write_kv_scales`); returns the number of attention layers."""
    arch = load_model_arch(checkpoint_dir)
    cpu = torch.device("cpu")
    model = load_model(checkpoint_dir, arch, torch.float32, cpu, attention_backend="torch")
    layers = {name.removesuffix(".attn"): m for name, m in model.named_modules() if isinstance(m, Attention)}
    measure_kv_scales(model, list(layers.values()), arch, torch.float32, cpu, sequences, progress)
    write_kv_scales(checkpoint_dir, {prefix: (layer.k_scale, layer.v_scale) for prefix, layer in layers.items()})
    return len(layers)


def write_kv_scales(checkpoint_dir: str, scales: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Add `prefix.k_scale` / `prefix.v_scale` [num_kv_heads, 1, 1] for each attention prefix
    ("model.layers.N.self_attn") to the checkpoint's one model.safetensors (as `lamina quantize` writes), and
    `kv_cache_scheme` to its quantization_config (an unquantized checkpoint gets compressed-tensors' KV-only one)."""
    path = Path(checkpoint_dir) / WEIGHT_FILE
    weights = load_file(str(path))
    for prefix, (k_scale, v_scale) in scales.items():
        weights[f"{prefix}.k_scale"] = k_scale.float().reshape(-1, 1, 1).clone()
        weights[f"{prefix}.v_scale"] = v_scale.float().reshape(-1, 1, 1).clone()
    save_file(weights, str(path), metadata={"format": "pt"})
    config_path = Path(checkpoint_dir) / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = {**config.get("quantization_config", KV_ONLY), "kv_cache_scheme": KV_CACHE_SCHEME}
    config_path.write_text(json.dumps(config, indent=2) + "\n")

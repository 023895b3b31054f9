"""Tiny random HF checkpoints of every supported architecture, written with `save_pretrained`.

    path = make_tiny_model("qwen3", tmp_path / "m")                      # defaults below
    path = make_tiny_model("llama", tmp_path / "t", tie_word_embeddings=True)
    path = make_tiny_model("mistral", tmp_path / "s", max_shard_size="50KB")   # sharded + index

Weights are drawn with a larger std than HF's default (0.2 instead of 0.02) so attention is peaked
and logits are well separated: a wrong mask, position or head mapping changes the logits visibly
and greedy decoding does not hinge on near-ties. Norm weights and biases, which HF initialises
to exactly 1 and 0, are perturbed so that a mis-wired norm or bias is caught too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

KINDS = ("llama", "llama3", "mistral", "qwen2", "qwen3")

BASE: dict[str, Any] = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
    initializer_range=0.2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}

_CLASSES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    # original_max_position_embeddings=64 with head_dim 16 puts frequencies in all three llama3 bands.
    "llama3": (LlamaConfig, LlamaForCausalLM, {"rope_scaling": LLAMA3_ROPE, "rope_theta": 500000.0}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": 512}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"use_sliding_window": False}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"use_sliding_window": False}),
}


def tiny_config(kind: str, **overrides: Any) -> Any:
    """The HF config object for `kind` (see KINDS) with BASE values, kind extras, then `overrides`."""
    if kind not in _CLASSES:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    config_cls, _, extras = _CLASSES[kind]
    return config_cls(**{**BASE, **extras, **overrides})


@torch.no_grad()
def _perturb_norms_and_biases(model: torch.nn.Module, generator: torch.Generator) -> None:
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=generator))
        elif name.endswith(".bias"):
            param.copy_(0.2 * torch.randn(param.shape, generator=generator))


def make_tiny_model(kind: str, path: str | Path, *, seed: int = 0, max_shard_size: str | None = None,
                    dtype: torch.dtype = torch.float32, **config_overrides: Any) -> Path:
    """Write a random `kind` checkpoint (config.json, generation_config.json, safetensors) to `path`.

    `config_overrides` go to the HF config (e.g. tie_word_embeddings=True, num_hidden_layers=3);
    `max_shard_size` (e.g. "50KB") splits the weights into shards plus model.safetensors.index.json;
    `dtype` is the dtype the weights are stored in. Returns `path`.
    """
    config = tiny_config(kind, **config_overrides)
    _, model_cls, _ = _CLASSES[kind]
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    _perturb_norms_and_biases(model, torch.Generator().manual_seed(seed + 1))
    model = model.to(dtype)
    path = Path(path)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), **kwargs)
    return path

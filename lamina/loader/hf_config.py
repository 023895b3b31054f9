"""Read a HF model directory's config.json into a small frozen `ModelArch` (defined in lamina.config,
so that the models, the KV cache and the worker read it without importing the loader).

Both config layouts written by transformers are understood:
  4.x: top-level `rope_theta` and `rope_scaling: {"type"|"rope_type": ..., "factor": ...}`, `torch_dtype`
  5.x: `rope_parameters: {"rope_type": ..., "rope_theta": ..., ...}`, `dtype`
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lamina.config import ModelArch
from lamina.layers.rotary import check_rope_scaling
from lamina.models.registry import supported_architectures
from lamina.quant.config import parse_quant_config

_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "max_position_embeddings")
# Qwen2 hard-codes bias=True on q/k/v; its config has no field saying so.
_ALWAYS_QKV_BIAS = ("Qwen2ForCausalLM",)


def _model_dir(model_dir: str) -> Path:
    path = Path(model_dir)
    if not path.exists():
        raise ValueError(f"model: path {model_dir!r} does not exist")
    if not path.is_dir():
        raise ValueError(f"model: {model_dir!r} is not a directory (expected a HF model directory)")
    return path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either layout; the scaling dict is normalised to "rope_type"."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    if "full_attention" in params:  # 5.x per-layer-type layout
        params = dict(params["full_attention"] or {})
    theta = float(params.pop("rope_theta", None) or raw.get("rope_theta") or 10000.0)
    partial = params.pop("partial_rotary_factor", None) or raw.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor: only 1.0 is supported, got {partial!r}")
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if rope_type == "default":
        return theta, None
    scaling = {"rope_type": rope_type, **params}
    check_rope_scaling(scaling)
    return theta, scaling


def _sliding_window(raw: dict[str, Any]) -> int | None:
    # Qwen2/3 keep a `sliding_window` value around even when `use_sliding_window` is false.
    if raw.get("use_sliding_window") is False:
        return None
    window = raw.get("sliding_window")
    return int(window) if window else None


def _check_supported(raw: dict[str, Any], config_path: Path) -> str:
    archs = raw.get("architectures") or []
    supported = supported_architectures()
    if not archs:
        raise ValueError(f"{config_path}: no `architectures` field; supported architectures are {supported}")
    if archs[0] not in supported:
        raise ValueError(f"architecture {archs[0]!r} is not supported; supported architectures are {supported}")
    missing = [name for name in _REQUIRED if raw.get(name) is None]
    if missing:
        raise ValueError(f"{config_path}: missing required field(s) {missing}")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act: only 'silu' is supported, got {raw['hidden_act']!r}")
    if raw.get("mlp_bias"):
        raise ValueError("mlp_bias: only false is supported")
    parse_quant_config(raw.get("quantization_config"))  # an unsupported method or scheme fails here, early
    return archs[0]


def _config_path(model: str) -> Path:
    """`model/config.json` for a model directory, or `model` itself when it is a `.json` file
    (a bare config, for load_format="dummy")."""
    path = Path(model)
    if path.suffix == ".json":
        if not path.is_file():
            raise ValueError(f"model: config file {model!r} does not exist")
        return path
    config_path = _model_dir(model) / "config.json"
    if not config_path.is_file():
        raise ValueError(f"model: no config.json in {model!r} (expected a HF model directory)")
    return config_path


def load_model_arch(model_dir: str) -> ModelArch:
    """Parse `model_dir/config.json` (or `model_dir` itself when it is a .json file); ValueError for
    a bad path, unsupported model or missing field."""
    config_path = _config_path(model_dir)
    raw = _read_json(config_path)
    architecture = _check_supported(raw, config_path)
    heads = int(raw["num_attention_heads"])
    kv_heads = int(raw.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
    rope_theta, rope_scaling = _rope(raw)
    return ModelArch(
        architecture=architecture,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_hidden_layers=int(raw["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=int(raw["max_position_embeddings"]),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)) or architecture in _ALWAYS_QKV_BIAS,
        torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
        sliding_window=_sliding_window(raw),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        raw=raw,
    )


def load_generation_config(model_dir: str) -> dict[str, Any]:
    """`generation_config.json` as a dict, or {} when the directory has none (or `model_dir` is a
    bare config .json file)."""
    if Path(model_dir).suffix == ".json" and Path(model_dir).is_file():
        return {}
    path = _model_dir(model_dir) / "generation_config.json"
    return _read_json(path) if path.is_file() else {}


def check_model_len(arch: ModelArch, max_model_len: int) -> None:
    """Refuse a context length this model cannot be served at exactly.

    lamina attends over the full context; a model trained with a sliding window shorter than
    max_model_len would silently see more context than it was trained on.
    """
    if not isinstance(max_model_len, int) or max_model_len <= 0:
        raise ValueError(f"max_model_len must be a positive integer, got {max_model_len!r}")
    window = arch.sliding_window
    if window is not None and window < max_model_len:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's sliding_window={window}, and lamina does "
            f"not implement sliding-window attention; lower max_model_len to at most {window}")

"""HF `architectures` name -> lamina model class.

Classes are imported on first use so that reading a config (and listing what is supported)
does not pull in the model code.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lamina.models.common import CausalLM

_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("lamina.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("lamina.models.mistral", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("lamina.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("lamina.models.qwen3", "Qwen3ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[CausalLM]:
    """The class implementing `architecture`; ValueError listing the supported ones otherwise."""
    if architecture not in _MODELS:
        raise ValueError(f"architecture {architecture!r} is not supported; "
                         f"supported architectures are {supported_architectures()}")
    module_name, class_name = _MODELS[architecture]
    return getattr(importlib.import_module(module_name), class_name)

"""lamina: a small, readable LLM inference engine.

    from lamina import LLM, SamplingParams
"""
from __future__ import annotations

from pathlib import Path

from lamina.outputs import CompletionOutput, RequestOutput
from lamina.sampling_params import RequestOutputKind, SamplingParams

_ASSETS = Path(__file__).resolve().parent / "assets"
DEMO_MODEL = str(_ASSETS / "demo-model")
DEMO_DRAFT = str(_ASSETS / "demo-draft")
DEMO_MEDUSA = str(_ASSETS / "demo-medusa")  # Medusa heads of DEMO_MODEL (lamina distill --method medusa)
DEMO_EAGLE = str(_ASSETS / "demo-eagle")  # an EAGLE-3 head of DEMO_MODEL (lamina distill --method eagle)

__all__ = ["LLM", "SamplingParams", "RequestOutputKind", "RequestOutput", "CompletionOutput", "DEMO_MODEL",
           "DEMO_DRAFT", "DEMO_MEDUSA", "DEMO_EAGLE"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # LLM pulls in torch and the model code: import it on first use only.
    if name == "LLM":
        from lamina.llm import LLM

        return LLM
    raise AttributeError(f"module 'lamina' has no attribute {name!r}")

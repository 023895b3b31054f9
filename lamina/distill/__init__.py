"""Distillation of draft / student models from a teacher (`lamina distill`).

Training needs the optional extra `lamina[train]` (`transformers`); importing this package does not
import torch or transformers until a submodule is used.

    python -m lamina.distill --teacher lamina/assets/demo-model --student-config draft.json \\
        --data DATA --out OUT          # same as: lamina distill ...
"""
from __future__ import annotations

__all__ = ["TrainConfig", "register"]


def __getattr__(name: str) -> object:
    if name == "TrainConfig":
        from .config import TrainConfig

        return TrainConfig
    if name == "register":
        from .cli import register

        return register
    raise AttributeError(f"module 'lamina.distill' has no attribute {name!r}")

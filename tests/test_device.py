"""lamina.device: the one dtype table and the one resolve_device (worker, loader and distill share them)."""
from __future__ import annotations

import pytest
import torch

from lamina.config import DTYPES, ModelArch
from lamina.device import MODEL_DTYPES, TORCH_DTYPES, resolve_device, resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _arch(torch_dtype: str | None) -> ModelArch:
    return ModelArch("LlamaForCausalLM", 32, 8, 16, 1, 2, 2, 4, 1e-6, 1e4, None, 64, False, False, torch_dtype,
                     None, None, None)


def test_the_table_covers_every_config_dtype() -> None:
    assert ("auto", *TORCH_DTYPES) == DTYPES
    assert MODEL_DTYPES == (torch.float32, torch.bfloat16, torch.float16)


def test_resolve_dtype() -> None:
    assert resolve_dtype("float16", _arch("bfloat16"), CPU) == torch.float16
    assert resolve_dtype("auto", _arch("bfloat16"), CPU) == torch.float32  # exact and fast on the CPU
    assert resolve_dtype("auto", _arch("float16"), CUDA) == torch.float16  # the checkpoint's, on a GPU
    assert resolve_dtype("auto", _arch(None), CUDA) == torch.bfloat16
    assert resolve_dtype("auto", _arch("int8"), CUDA) == torch.bfloat16


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("cpu") == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == CPU
    for name in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=f"device: '{name}' was asked for but no CUDA GPU is available"):
            resolve_device(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == CUDA and resolve_device("cuda:1") == torch.device("cuda:1")

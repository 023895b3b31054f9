"""W8A8 checkpoints made by llm-compressor itself (SmoothQuant + W8A8 int8, FP8_DYNAMIC) load in lamina and
give transformers' logits (transformers runs them through compressed-tensors, activations fake-quantized).

One convention differs: compressed-tensors scales a symmetric int8 activation by max|x| / 127.5 where vLLM's
kernels (and lamina) use max|x| / 127; with lamina switched to 127.5 the int8 logits agree to 1e-4, which
proves the weights, scales and smoothed norms are read right; with 127 they differ by about 0.1 logit."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import lamina.quant.w8a8 as w8a8
from lamina.quant.fp8 import Fp8LinearMethod
from lamina.quant.w8a8_int8 import W8A8Int8LinearMethod
from tests.quant.helpers import hf_logits, lamina_logits, load

pytest.importorskip("compressed_tensors")

FIXTURES = Path(__file__).parent / "data" / "llmcompressor"
NAMES = ("smoothquant_w8a8", "fp8_dynamic")


def _check(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if "fp8" not in model_dir.name:
        monkeypatch.setattr(w8a8, "INT8_MAX", 127.5)  # compressed-tensors' convention (module docstring)
    ours, theirs = lamina_logits(model_dir), hf_logits(model_dir)
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-4)
        assert torch.equal(ours[key].argmax(-1), theirs[key].argmax(-1))


@pytest.mark.parametrize("name", NAMES)
def test_llmcompressor_w8a8_checkpoints_match_transformers(name, monkeypatch):
    _check(FIXTURES / name, monkeypatch)


def test_fixtures_are_the_w8a8_formats():
    for name, fmt, cls in (("smoothquant_w8a8", "int-quantized", W8A8Int8LinearMethod),
                           ("fp8_dynamic", "float-quantized", Fp8LinearMethod)):
        config = json.loads((FIXTURES / name / "config.json").read_text())["quantization_config"]
        group = config["config_groups"]["group_0"]
        assert config["format"] == fmt and group["input_activations"]["strategy"] == "token"
        assert group["input_activations"]["dynamic"] is True
        model = load(FIXTURES / name)
        assert isinstance(model.model.layers[0].mlp.gate_up_proj.quant_method, cls)


def test_vllm_activation_convention_is_the_default():
    """lamina quantizes activations as vLLM does (127), which is not compressed-tensors' fake quantization."""
    ours, theirs = lamina_logits(FIXTURES / "smoothquant_w8a8"), hf_logits(FIXTURES / "smoothquant_w8a8")
    assert max((ours[k] - theirs[k]).abs().max() for k in ours) > 1e-3


@pytest.mark.skipif(importlib.util.find_spec("llmcompressor") is None, reason="llmcompressor is not installed")
@pytest.mark.parametrize("name", NAMES)
def test_fresh_llmcompressor_w8a8_checkpoints_match_transformers(name, tmp_path, monkeypatch):
    from tests.quant.make_llmcompressor_fixtures import make

    _check(make(name, tmp_path / "out", tmp_path), monkeypatch)

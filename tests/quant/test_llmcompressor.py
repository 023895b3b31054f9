"""Checkpoints made by llm-compressor itself (GPTQ W4A16, RTN W4A16_ASYM, RTN W8A16 with the LM head
quantized) load in lamina and give transformers' logits (transformers decompresses them with
compressed-tensors). The checkpoints are committed (tests/quant/make_llmcompressor_fixtures.py made them);
where llmcompressor is installed, they are also made afresh and checked the same way."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from lamina.quant.wna16 import WNA16LinearMethod
from tests.quant.helpers import hf_logits, lamina_logits, load

pytest.importorskip("compressed_tensors")

FIXTURES = Path(__file__).parent / "data" / "llmcompressor"
NAMES = ("gptq_w4a16", "rtn_w4a16_asym", "rtn_w8a16_lm_head")


def _check(model_dir: Path) -> None:
    ours, theirs = lamina_logits(model_dir), hf_logits(model_dir)
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_llmcompressor_checkpoints_match_transformers(name):
    _check(FIXTURES / name)


def test_fixtures_cover_what_they_claim():
    schemes = {name: json.loads((FIXTURES / name / "config.json").read_text())["quantization_config"]
               for name in NAMES}
    weights = {name: q["config_groups"]["group_0"]["weights"] for name, q in schemes.items()}
    assert weights["gptq_w4a16"]["actorder"] == "static" and weights["gptq_w4a16"]["num_bits"] == 4
    assert weights["rtn_w4a16_asym"]["symmetric"] is False
    assert weights["rtn_w8a16_lm_head"]["num_bits"] == 8 and schemes["rtn_w8a16_lm_head"]["ignore"] == []
    head = load(FIXTURES / "rtn_w8a16_lm_head").lm_head
    assert isinstance(head.quant_method, WNA16LinearMethod)


@pytest.mark.skipif(importlib.util.find_spec("llmcompressor") is None, reason="llmcompressor is not installed")
@pytest.mark.parametrize("name", NAMES)
def test_fresh_llmcompressor_checkpoints_match_transformers(name, tmp_path):
    from tests.quant.make_llmcompressor_fixtures import make

    _check(make(name, tmp_path / "out", tmp_path))

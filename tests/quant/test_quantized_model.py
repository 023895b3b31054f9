"""Quantized checkpoints in lamina's models and engine: the logits equal those of the same model with the
dequantized weights written out in float32 (the reference path is exact), and the engine runs them like any
model (prefix cache on or off, block accounting intact); the int8 demo model mostly agrees with the demo."""
from __future__ import annotations

import shutil

import pytest
import torch

from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.quant.recipe import get_recipe
from lamina.quantize.writer import quantize_checkpoint
from tests.quant.helpers import dequantized_checkpoint, lamina_logits, quantized, tiny_model

TOKEN_PROMPTS = [{"prompt_token_ids": ids} for ids in ([5, 17, 33, 101, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9], [250, 3])]
DEMO_PROMPTS = ["def fibonacci(n):", "class Stack:", "import os\n\n\ndef list_python_files(root):",
                "def is_prime(n):", "for line in open(path):"]


@pytest.mark.parametrize("kind,method,tied,ignore", [
    ("llama", "rtn4", False, ()),  # the LM head quantized too
    ("llama", "int8", True, ("lm_head",)),
    ("qwen2", "rtn4", False, ("lm_head",)),  # q/k/v biases
    ("qwen3", "int8", False, ("lm_head",)),  # q/k norms
])
def test_quantized_logits_equal_the_dequantized_reference(tmp_path, kind, method, tied, ignore):
    source = tiny_model(tmp_path / "fp32", kind, tie_word_embeddings=tied)
    out = quantized(source, tmp_path / "q", method, ignore=ignore)
    reference = dequantized_checkpoint(out, tmp_path / "dq")
    ours, expected = lamina_logits(out), lamina_logits(reference)
    for key in expected:
        assert torch.equal(ours[key], expected[key]), key
    unquantized = lamina_logits(source)
    assert any(not torch.equal(ours[k], unquantized[k]) for k in ours)  # it did quantize


def _greedy(llm: LLM, prompts: list, max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    llm.engine.check_integrity()
    return outs


def test_engine_runs_a_quantized_checkpoint_like_its_reference(tmp_path):
    source = tiny_model(tmp_path / "fp32")
    out = quantized(source, tmp_path / "q", "rtn4")
    reference = dequantized_checkpoint(out, tmp_path / "dq")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(out / name, reference / name)
    kwargs = dict(block_size=4, num_kv_blocks=128, max_model_len=128)
    expected = _greedy(LLM(model=str(reference), **kwargs), TOKEN_PROMPTS, 12)
    cached = LLM(model=str(out), **kwargs)
    assert _greedy(cached, TOKEN_PROMPTS, 12) == expected
    assert _greedy(cached, TOKEN_PROMPTS * 2, 12) == expected * 2  # second pass: prefix-cache hits
    assert _greedy(LLM(model=str(out), enable_prefix_caching=False, **kwargs), TOKEN_PROMPTS, 12) == expected


@pytest.fixture(scope="module")
def demo_int8(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "int8"
    quantize_checkpoint(DEMO_MODEL, str(out), get_recipe("int8"), 0, progress=False)
    return str(out)


def test_int8_demo_model_agrees_with_the_demo_model(demo_int8):
    kwargs = dict(num_kv_blocks=256, max_model_len=256)
    base = _greedy(LLM(model=DEMO_MODEL, **kwargs), DEMO_PROMPTS, 32)
    int8 = _greedy(LLM(model=demo_int8, **kwargs), DEMO_PROMPTS, 32)
    agree = sum(a == b for x, y in zip(base, int8) for a, b in zip(x, y))
    assert agree >= 0.8 * 32 * len(DEMO_PROMPTS), (agree, base, int8)

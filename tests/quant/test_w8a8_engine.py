"""The engine runs W8A8 checkpoints like any model: the same greedy tokens with the prefix cache on (cold and
warm) and off, no leaked KV blocks, and its first token is the argmax of the model's own logits."""
from __future__ import annotations

import pytest
import torch

from lamina import LLM, SamplingParams
from tests.quant.helpers import PROMPTS, lamina_logits, quantized, tiny_model

TOKEN_PROMPTS = [{"prompt_token_ids": ids} for ids in PROMPTS.values()]


def _greedy(llm: LLM, prompts: list, max_tokens: int = 12) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    llm.engine.check_integrity()
    return outs


@pytest.mark.parametrize("method", ["llm_int8", "w8a8", "fp8"])
def test_engine_runs_w8a8_checkpoints(tmp_path, method):
    out = quantized(tiny_model(tmp_path / "fp32"), tmp_path / method, method, group_size=0)
    kwargs = dict(block_size=4, num_kv_blocks=128, max_model_len=128)
    cached = LLM(model=str(out), **kwargs)
    first = _greedy(cached, TOKEN_PROMPTS)
    assert _greedy(cached, TOKEN_PROMPTS * 2) == first * 2  # prefix-cache hits
    assert _greedy(LLM(model=str(out), enable_prefix_caching=False, **kwargs), TOKEN_PROMPTS) == first
    logits = lamina_logits(out)
    assert [tokens[0] for tokens in first] == [int(logits[k][-1].argmax()) for k in PROMPTS]


def test_transformers_serves_llm_int8_as_the_w8a16_it_also_is(tmp_path):
    """The lamina_llm_int8 marker is ignored by compressed-tensors: transformers runs int8's W8A16."""
    pytest.importorskip("compressed_tensors")
    from tests.quant.helpers import hf_logits

    source = tiny_model(tmp_path / "fp32")
    marked = quantized(source, tmp_path / "llm_int8", "llm_int8", group_size=0)
    plain = quantized(source, tmp_path / "int8", "int8", group_size=0)
    assert (marked / "model.safetensors").read_bytes() == (plain / "model.safetensors").read_bytes()
    theirs, w8a16 = hf_logits(marked), lamina_logits(plain)
    for key in w8a16:
        torch.testing.assert_close(theirs[key], w8a16[key], rtol=1e-4, atol=1e-4)
    ours = lamina_logits(marked)
    assert any(not torch.equal(ours[k], w8a16[k]) for k in ours)  # lamina does run LLM.int8()

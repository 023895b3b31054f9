"""Worker: KV cache sizing, dtype resolution, input batch layout."""
from __future__ import annotations

import pytest
import torch

from lamina import LLM, SamplingParams
from lamina.kv.cache import kv_cache_bytes_per_block
from tests.helpers.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_model("qwen2", tmp_path_factory.mktemp("worker"), tie_word_embeddings=True))


def test_kv_cache_sized_from_a_byte_budget(model_dir):
    llm = LLM(model=model_dir, skip_tokenizer_init=True, block_size=8, kv_cache_memory_bytes=1 << 20)
    worker = llm.engine.executor.worker
    per_block = kv_cache_bytes_per_block(llm.engine.arch, 8, torch.float32)
    assert per_block == 2 * 2 * 8 * 2 * 16 * 4  # K and V, 2 layers, 8 tokens, 2 KV heads, head_dim 16, fp32
    assert worker.num_blocks == (1 << 20) // per_block
    assert worker.kv_capacity_tokens == (worker.num_blocks - 1) * 8
    assert llm.engine.max_model_len == min(512, worker.kv_capacity_tokens)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        LLM(model=model_dir, skip_tokenizer_init=True, kv_cache_memory_bytes=100)


def test_num_kv_blocks_wins_and_caps_max_model_len(model_dir):
    llm = LLM(model=model_dir, skip_tokenizer_init=True, block_size=4, num_kv_blocks=9,
              kv_cache_memory_bytes=1 << 30)
    assert llm.engine.executor.worker.num_blocks == 9 and llm.engine.max_model_len == 32
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLM(model=model_dir, skip_tokenizer_init=True, max_model_len=513)


@pytest.mark.parametrize("dtype, expected", [("auto", torch.float32), ("bfloat16", torch.bfloat16),
                                             ("float16", torch.float16)])
def test_dtypes_run_and_agree_with_float32(model_dir, dtype, expected):
    prompt = {"prompt_token_ids": [3, 17, 42, 9, 100, 7]}
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
    ref = LLM(model=model_dir, skip_tokenizer_init=True, num_kv_blocks=64).generate(prompt, params, use_tqdm=False)
    llm = LLM(model=model_dir, skip_tokenizer_init=True, num_kv_blocks=64, dtype=dtype)
    assert next(llm.engine.executor.worker.model.parameters()).dtype == expected
    out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    first_ref = ref[0].outputs[0]
    # The first token's logprob agrees within the precision of the dtype.
    token = first_ref.token_ids[0]
    tol = 1e-5 if expected == torch.float32 else 0.1
    assert out.token_ids[0] == token
    assert abs(out.logprobs[0][token].logprob - first_ref.logprobs[0][token].logprob) < tol
    llm.engine.check_integrity()


def test_sliding_window_caps_the_default_and_refuses_more(tmp_path):
    path = str(make_tiny_model("mistral", tmp_path / "m", sliding_window=64))
    assert LLM(model=path, skip_tokenizer_init=True, num_kv_blocks=64).engine.max_model_len == 64
    with pytest.raises(ValueError, match="sliding_window"):
        LLM(model=path, skip_tokenizer_init=True, num_kv_blocks=64, max_model_len=128)

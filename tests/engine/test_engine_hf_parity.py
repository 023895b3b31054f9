"""End to end: lamina's greedy tokens equal HF transformers' on tiny random checkpoints of every
supported architecture, with chunked prefill forced, preemption forced, and the prefix cache on/off."""
from __future__ import annotations

import random

import pytest

from lamina import LLM, SamplingParams
from tests.helpers.hf_oracle import hf_greedy, load_hf
from tests.helpers.tiny_models import make_tiny_model

MAX_NEW = 10
KINDS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]


def random_prompts(seed: int, lengths: list[int], vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def lamina_greedy(llm: LLM, prompts: list[list[int]], max_new: int = MAX_NEW) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.engine.check_integrity()
    assert not llm.engine.has_unfinished_requests()
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module", params=KINDS)
def tiny(request, tmp_path_factory):
    path = make_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    model = load_hf(str(path))
    prompts = random_prompts(1, [3, 17, 33, 6, 21], model.config.vocab_size)
    expected = [hf_greedy(model, p, MAX_NEW) for p in prompts]
    return str(path), prompts, expected


def test_greedy_matches_hf_mixed_lengths(tiny):
    path, prompts, expected = tiny
    llm = LLM(model=path, skip_tokenizer_init=True, block_size=4, num_kv_blocks=128)
    assert lamina_greedy(llm, prompts) == expected


def test_greedy_matches_hf_with_chunked_prefill(tiny):
    path, prompts, expected = tiny
    llm = LLM(model=path, skip_tokenizer_init=True, block_size=4, num_kv_blocks=128, max_num_batched_tokens=7)
    assert lamina_greedy(llm, prompts) == expected
    assert llm.engine.get_stats().num_steps > len(prompts) + MAX_NEW  # prompts really were chunked


def test_greedy_matches_hf_with_preemption(tiny):
    path, prompts, expected = tiny
    # 24 blocks of 4 tokens: not enough for all five requests at once (5 * ~11 blocks)
    llm = LLM(model=path, skip_tokenizer_init=True, block_size=4, num_kv_blocks=25, max_model_len=64)
    assert lamina_greedy(llm, prompts) == expected
    assert llm.engine.get_stats().num_preemptions > 0


@pytest.mark.parametrize("caching", [True, False])
def test_greedy_matches_hf_with_shared_prefixes(tiny, caching):
    path, prompts, _ = tiny
    shared = prompts[2]  # 33 tokens
    variants = [shared + p[:4] for p in prompts] + [shared]
    model = load_hf(path)
    expected = [hf_greedy(model, p, 6) for p in variants]
    llm = LLM(model=path, skip_tokenizer_init=True, block_size=4, num_kv_blocks=256,
              enable_prefix_caching=caching)
    first = lamina_greedy(llm, variants[:1], 6)
    rest = lamina_greedy(llm, variants[1:], 6)
    assert first + rest == expected
    hit_rate = llm.engine.get_stats().prefix_cache_hit_rate
    assert (hit_rate > 0.5) if caching else (hit_rate == 0.0)

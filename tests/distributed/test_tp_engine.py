"""TP=2 over gloo is token-identical to TP=1 (fp32) on tiny HF checkpoints, with chunked prefill, the prefix
cache, preemption and async scheduling in one workload; greedy and seeded sampling.

One TP=2 engine per model kind (starting two processes costs seconds): qwen3 (2 KV heads, split over the ranks)
and qwen2 with 1 KV head (replicated on both ranks), qkv bias, tied embeddings and an odd vocab (the last
rank's vocab slice is padded)."""
from __future__ import annotations

import random

import pytest

from lamina import LLM, SamplingParams
from tests.helpers.tiny_models import make_tiny_model

MAX_NEW = 8
ENGINE = dict(skip_tokenizer_init=True, block_size=4, num_kv_blocks=30, max_model_len=96, max_num_batched_tokens=16,
              enable_prefix_caching=True)
MODELS = {"qwen3": {}, "qwen2-mqa": dict(num_key_value_heads=1, vocab_size=255, tie_word_embeddings=True)}


def workload(vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts sharing a 24-token prefix (prefix hits), long enough to be chunked (budget 16), too many at
    once for 29 blocks of 4 tokens (preemption); greedy, one seeded sampled request."""
    rng = random.Random(3)
    shared = [rng.randrange(vocab) for _ in range(24)]
    prompts = [shared + [rng.randrange(vocab) for _ in range(n)] for n in (3, 9, 17, 5)]
    prompts += [[rng.randrange(vocab) for _ in range(n)] for n in (30, 2)]
    greedy = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=MAX_NEW, ignore_eos=True)
    return prompts, [greedy] * (len(prompts) - 1) + [sampled]


def run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:1]], params[:1], use_tqdm=False)
    outs += llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params[1:], use_tqdm=False)
    llm.engine.check_integrity()
    assert not llm.engine.has_unfinished_requests()
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request, tmp_path_factory):
    kind = request.param.split("-")[0]
    path = str(make_tiny_model(kind, tmp_path_factory.mktemp(request.param), **MODELS[request.param]))
    vocab = MODELS[request.param].get("vocab_size", 256)
    prompts, params = workload(vocab)
    expected = run(LLM(model=path, **ENGINE), prompts, params)
    llm = LLM(model=path, tensor_parallel_size=2, **ENGINE)
    yield llm, prompts, params, expected
    llm.shutdown()


def test_tp2_matches_tp1(pair) -> None:
    llm, prompts, params, expected = pair
    assert run(llm, prompts, params) == expected
    stats = llm.engine.get_stats()
    assert stats.num_preemptions > 0
    assert stats.prefix_cache_hit_rate > 0
    assert stats.num_steps > len(prompts) + MAX_NEW  # prompts were chunked


def test_workers_hold_their_shard(pair) -> None:
    llm = pair[0]
    worker = llm.engine.executor.worker
    assert worker.group.size == 2 and worker.group.rank == 0
    attn = worker.model.model.layers[0].self_attn
    arch = llm.engine.arch
    assert attn.qkv_proj.num_heads == arch.num_attention_heads // 2
    assert attn.qkv_proj.num_kv_heads == max(1, arch.num_key_value_heads // 2)
    assert worker.rank_arch.num_key_value_heads == attn.qkv_proj.num_kv_heads  # the KV cache is per rank
    k_cache = attn.attn.kv_cache[0]
    assert k_cache.shape[2] == attn.qkv_proj.num_kv_heads and k_cache.shape[0] == llm.engine.num_blocks

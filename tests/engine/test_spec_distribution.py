"""Sampling with n-gram drafts keeps the target distribution: the generated tokens that drafts propose are
distributed as without speculation, by two-sample chi-square tests over thousands of requests."""
from __future__ import annotations

from collections import Counter

import pytest

from lamina import LLM, SamplingParams
from lamina.bench.sampling import chi2_critical
from tests.helpers.tiny_models import make_tiny_model

VOCAB = 24
NUM_REQUESTS = 4000
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(make_tiny_model("qwen3", tmp_path_factory.mktemp("spec_dist"), vocab_size=VOCAB))


def make_llm(model_dir: str, spec: dict | None) -> LLM:
    return LLM(model=model_dir, skip_tokenizer_init=True, block_size=4, num_kv_blocks=4096, max_model_len=96,
               max_num_seqs=512, max_num_batched_tokens=8192, speculative_config=spec)


@pytest.fixture(scope="module")
def prompt(model_dir: str) -> list[int]:
    """The model's own greedy text, so that drafts looked up in it are often likely: acceptance is high enough
    for a wrong verifier to show (at random drafts it would be ~1/VOCAB)."""
    out = make_llm(model_dir, None).generate([{"prompt_token_ids": [1, 2, 3]}],
                                              SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                                              use_tqdm=False)
    return [1, 2, 3] + out[0].outputs[0].token_ids


def samples(model_dir: str, prompt: list[int], spec: dict | None) -> tuple[list[tuple[int, ...]], LLM]:
    llm = make_llm(model_dir, spec)
    params = SamplingParams(temperature=0.6, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": prompt}] * NUM_REQUESTS, params, use_tqdm=False)
    llm.engine.check_integrity()
    return [tuple(o.outputs[0].token_ids) for o in outputs], llm


def two_sample_chi2(a: Counter, b: Counter, min_count: int = 10) -> tuple[float, int]:
    """Pearson's statistic for two equal-size samples, cells seen fewer than min_count times merged."""
    cells, rare = [], [0, 0]
    for key in set(a) | set(b):
        if a[key] + b[key] >= min_count:
            cells.append((a[key], b[key]))
        else:
            rare[0], rare[1] = rare[0] + a[key], rare[1] + b[key]
    if sum(rare):
        cells.append(tuple(rare))
    return sum((x - y) ** 2 / (x + y) for x, y in cells), len(cells) - 1


def test_drafted_tokens_keep_the_target_distribution(model_dir: str, prompt: list[int]) -> None:
    plain, _ = samples(model_dir, prompt, None)
    drafted, llm = samples(model_dir, prompt, {"num_speculative_tokens": 2, "prompt_lookup_max": 2, "adaptive": False})
    stats = llm.engine.get_stats().spec
    assert stats.num_draft_tokens > NUM_REQUESTS // 2 and stats.acceptance_rate > 0.2, stats
    for position in range(1, MAX_TOKENS):
        stat, df = two_sample_chi2(Counter(t[position] for t in plain), Counter(t[position] for t in drafted))
        assert df > 5 and stat < chi2_critical(df), (position, stat, df)
    joint, df = two_sample_chi2(Counter(t[:2] for t in plain), Counter(t[:2] for t in drafted))
    assert joint < chi2_critical(df), (joint, df)

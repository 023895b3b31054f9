"""Sampling with drafts keeps the target distribution: the generated tokens are distributed as without
speculation, by two-sample chi-square tests over thousands of unseeded requests, for n-gram drafts (one-hot), for
drafts sampled from a draft model's and early exit's own distributions (lamina/spec/draft_sampling.py), and for the
shipped EAGLE head's argmax drafts and the demo draft model's tree drafts on the demo model (a tiny model's random head
is too seldom right to test, and a tiny random model's next token depends too little on its context for a wrong one
to show)."""
from __future__ import annotations

from collections import Counter

import pytest

from lamina import DEMO_DRAFT, DEMO_EAGLE, DEMO_MODEL, LLM, SamplingParams
from lamina.bench.sampling import chi2_critical
from tests.helpers.spec_tree import perturbed_copy
from tests.helpers.tiny_models import make_tiny_model

VOCAB = 24
NUM_REQUESTS = 4000
MAX_TOKENS = 4
DEMO_PROMPT, DEMO_REQUESTS = "class Stack:\n    def __init__(self):\n        self.", 2000


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


@pytest.fixture(scope="module")
def plain(model_dir: str, prompt: list[int]) -> list[tuple[int, ...]]:
    return samples(model_dir, prompt, None)[0]


def spec_config(method: str, model_dir: str, tmp_path_factory) -> dict:
    """n-gram lookup, a draft model close to the target, or the target's first layer: drafts often rejected."""
    if method == "ngram":
        return {"num_speculative_tokens": 2, "prompt_lookup_max": 2, "adaptive": False}
    if method == "draft_model":
        draft = perturbed_copy(model_dir, tmp_path_factory.mktemp("spec_dist_draft"))
        return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2, "adaptive": False}
    return {"method": "early_exit", "exit_layer": 1, "num_speculative_tokens": 2, "adaptive": False}


@pytest.mark.parametrize(("method", "least_acceptance"), [("ngram", 0.2), ("draft_model", 0.3), ("early_exit", 0.1)])
def test_drafted_tokens_keep_the_target_distribution(model_dir: str, prompt: list[int], plain: list, method: str,
                                                     least_acceptance: float, tmp_path_factory) -> None:
    drafted, llm = samples(model_dir, prompt, spec_config(method, model_dir, tmp_path_factory))
    stats = llm.engine.get_stats().spec
    # drafts accepted often enough to matter, rejected often enough to test the rejections
    assert stats.num_draft_tokens > NUM_REQUESTS // 2 and least_acceptance < stats.acceptance_rate < 0.9, stats
    for position in range(1, MAX_TOKENS):
        stat, df = two_sample_chi2(Counter(t[position] for t in plain), Counter(t[position] for t in drafted))
        assert df > 5 and stat < chi2_critical(df), (position, stat, df)
    joint, df = two_sample_chi2(Counter(t[:2] for t in plain), Counter(t[:2] for t in drafted))
    assert joint < chi2_critical(df), (joint, df)


def demo_samples(spec: dict | None) -> tuple[list[tuple[int, ...]], LLM]:
    llm = LLM(DEMO_MODEL, speculative_config=spec, block_size=4, num_kv_blocks=4096, max_model_len=96,
              max_num_seqs=512, max_num_batched_tokens=8192)
    params = SamplingParams(temperature=0.6, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate([DEMO_PROMPT] * DEMO_REQUESTS, params, use_tqdm=False)
    llm.engine.check_integrity()
    return [tuple(o.outputs[0].token_ids) for o in outputs], llm


def test_eagle_drafts_keep_the_demo_models_distribution() -> None:
    """The shipped EAGLE head on the demo model (argmax drafts, accepted ~40 % of the time on this prompt at
    T = 0.6): the generated tokens are distributed as without speculation."""
    plain, _ = demo_samples(None)
    drafted, llm = demo_samples({"method": "eagle", "model": DEMO_EAGLE, "num_speculative_tokens": 2,
                                 "adaptive": False})
    stats = llm.engine.get_stats().spec
    assert stats.num_draft_tokens > DEMO_REQUESTS and 0.2 < stats.acceptance_rate < 0.9, stats
    for position in range(1, MAX_TOKENS):
        stat, df = two_sample_chi2(Counter(t[position] for t in plain), Counter(t[position] for t in drafted))
        assert df > 5 and stat < chi2_critical(df), (position, stat, df)
    joint, df = two_sample_chi2(Counter(t[:2] for t in plain), Counter(t[:2] for t in drafted))
    assert joint < chi2_critical(df), (joint, df)


def test_tree_drafts_keep_the_demo_models_distribution() -> None:
    """The demo draft model's tree drafts: two candidates for the next token (the first two finishers of its race;
    MAX_TOKENS leaves room for two drafts), the second accepted when its sample is not the first, whose row then
    samples the token after it with the tree's mask (the two agreed with the sample in ~91 % of verify steps).
    Token-for-token checks of the walk and the mask are tests/engine/test_spec_tree.py's."""
    plain, _ = demo_samples(None)
    drafted, llm = demo_samples({"method": "draft_model", "model": DEMO_DRAFT,
                                 "speculative_token_tree": [(0,), (1,), (1, 0)], "adaptive": False})
    stats = llm.engine.get_stats().spec
    assert stats.num_draft_tokens > DEMO_REQUESTS and stats.accepted_per_pos[0] > 0.5 * DEMO_REQUESTS, stats
    for position in range(1, MAX_TOKENS):
        stat, df = two_sample_chi2(Counter(t[position] for t in plain), Counter(t[position] for t in drafted))
        assert df > 5 and stat < chi2_critical(df), (position, stat, df)
    joint, df = two_sample_chi2(Counter(t[:2] for t in plain), Counter(t[:2] for t in drafted))
    assert joint < chi2_critical(df), (joint, df)

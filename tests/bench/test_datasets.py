"""Dataset generators: length distributions, id ranges, determinism, W1's exact stream, clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from lamina.bench.datasets import (DatasetConfig, ServerLimits, fit_lengths, fit_to_server, length_bounds,
                                   sample_requests)


def test_random_fixed_lengths_and_id_range():
    reqs = sample_requests(DatasetConfig(num_prompts=50, input_len=64, output_len=16, vocab_size=100))
    assert len(reqs) == 50
    assert {r.prompt_len for r in reqs} == {64} and {r.expected_output_len for r in reqs} == {16}
    ids = np.concatenate([r.prompt for r in reqs])
    assert ids.min() >= 0 and ids.max() < 100
    assert len(set(ids.tolist())) > 90  # uniform over the vocabulary, not a constant


def test_random_range_ratio_bounds_and_mean():
    cfg = DatasetConfig(num_prompts=4000, input_len=200, output_len=100, range_ratio=0.5, seed=3)
    reqs = sample_requests(cfg)
    ins = np.array([r.prompt_len for r in reqs])
    outs = np.array([r.expected_output_len for r in reqs])
    assert length_bounds(200, 0.5) == (100, 300)
    assert ins.min() >= 100 and ins.max() <= 300 and abs(ins.mean() - 200) < 5
    assert outs.min() >= 50 and outs.max() <= 150 and abs(outs.mean() - 100) < 3
    assert all(len(r.prompt) == r.prompt_len for r in reqs)


def test_random_is_seeded():
    a = sample_requests(DatasetConfig(num_prompts=5, input_len=20, range_ratio=0.5, seed=1))
    b = sample_requests(DatasetConfig(num_prompts=5, input_len=20, range_ratio=0.5, seed=1))
    c = sample_requests(DatasetConfig(num_prompts=5, input_len=20, range_ratio=0.5, seed=2))
    assert a == b and a != c


def test_w1_matches_benchmarks_md():
    reqs = sample_requests(DatasetConfig(name="w1", num_prompts=256, seed=0))
    assert sum(r.expected_output_len for r in reqs) == 133_966  # BENCHMARKS.md, seed 0
    ins = np.array([r.prompt_len for r in reqs])
    assert ins.min() >= 100 and ins.max() <= 1024 and 450 < ins.mean() < 680
    assert max(max(r.prompt) for r in reqs) <= 10000


def test_text_prompts_have_one_word_per_token():
    reqs = sample_requests(DatasetConfig(num_prompts=3, input_len=30, output_len=5, prompt_format="text"))
    assert all(isinstance(r.prompt, str) and len(r.prompt.split()) == 30 for r in reqs)


@pytest.mark.parametrize("kwargs, option", [
    ({"name": "sharegpt"}, "--dataset"), ({"range_ratio": 1.0}, "--random-range-ratio"),
    ({"num_prompts": 0}, "--num-prompts"), ({"input_len": 0}, "--random-input-len"),
    ({"prompt_format": "bytes"}, "--prompt-format"), ({"vocab_size": 0}, "--random-vocab-size"),
])
def test_bad_options_name_the_option(kwargs, option):
    with pytest.raises(ValueError, match=option):
        DatasetConfig(**kwargs)


@pytest.mark.parametrize("asked, limit, fitted", [
    ((1024, 128), 1024, (896, 128)),  # the README's defaults against the demo model's context
    ((10, 200), 128, (10, 118)), ((1024, 1024), 1024, (512, 512)), ((500, 1000), 1024, (500, 524)),
    ((100, 20), 128, (100, 20)), ((5, 5), 2, (1, 1)),
])
def test_fit_lengths_keeps_both_sides_and_fills_the_context(asked, limit, fitted):
    assert fit_lengths(*asked, limit) == fitted


def test_fit_to_server_folds_ids_and_shortens_prompts():
    reqs = sample_requests(DatasetConfig(name="w1", num_prompts=20, seed=0))
    limits = ServerLimits(max_model_len=1024, vocab_size=8192)
    report = fit_to_server(reqs, limits)
    assert all(max(r.prompt) < 8192 and r.prompt_len + r.expected_output_len <= 1024 for r in report.requests)
    assert all(r.prompt_len == len(r.prompt) for r in report.requests)
    assert 0 < report.num_folded <= 20 and 0 < report.num_shortened < 20
    assert len(report.notes(limits)) == 2
    assert fit_to_server(reqs, ServerLimits()).requests == reqs  # a server that reports nothing: unchanged
    text = sample_requests(DatasetConfig(num_prompts=2, input_len=300, prompt_format="text"), ServerLimits(256))
    assert all(len(r.prompt.split()) == r.prompt_len == 128 for r in text)

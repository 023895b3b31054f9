"""Dataset generators: length distributions, id ranges, determinism, W1's exact stream, clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from lamina.bench.datasets import DatasetConfig, length_bounds, sample_requests


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

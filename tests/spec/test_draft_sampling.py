"""Drafts drawn with the verify rows' noise (lamina/spec/draft_sampling.py): the same keys as the rows that verify
them, the same draw as the target's sampler on the same logits (torch path and kernel), a sample of q, and
accepted as often as the coupling's formula says."""
from __future__ import annotations

import importlib.util
from collections import Counter

import numpy as np
import pytest
import torch

from lamina.bench.sampling import chi2_critical
from lamina.layers.sampler import Sampler
from lamina.layers.sampling_metadata import SamplingMetadata, philox_keys, seeded_keys
from lamina.sampling_params import SamplingParams
from lamina.spec.draft_sampling import DraftKeys, DraftPicker, pick
from lamina.spec.model_proposer import DraftRequest
from lamina.worker.model_runner import _seeded_generators

CPU = torch.device("cpu")
PARAMS = [SamplingParams(temperature=0.7), SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_p=0.8),
          SamplingParams(temperature=0.5, min_p=0.2), SamplingParams(temperature=1.3, top_p=0.9, min_p=0.05)]
SEEDS = [5, 11, -3, 2**70 + 9, 0]
POSITIONS = [10, 4, 7, 1, 30]


def requests(params: list[SamplingParams], seeds: list[int | None], lengths: list[int]) -> list[DraftRequest]:
    return [DraftRequest(f"r{i}", [1] * n, [1] * 8, 3, seed, p.temperature, p.top_p, p.min_p)
            for i, (p, seed, n) in enumerate(zip(params, seeds, lengths))]


def draft_inputs(params: list[SamplingParams]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """pick's params and keys for draft 0 of rows that sample the tokens at POSITIONS."""
    keys = DraftKeys.of(requests(params, SEEDS, POSITIONS), 1)
    return list(torch.from_numpy(keys.params)), torch.from_numpy(keys.keys[0])


def test_keys_are_those_of_the_rows_that_verify_the_drafts() -> None:
    """Draft j of a request of N tokens is verified by the row that samples token N + j, keyed by philox_keys."""
    keys = DraftKeys.of(requests(PARAMS[:1], [5], [10]), 3)
    assert keys.keys[:, 0].tolist() == philox_keys([5, 5, 5], [10, 11, 12], step_key=0)
    assert seeded_keys([5, -3], [10, 7]).tolist() == philox_keys([5, -3], [10, 7], step_key=123)
    assert keys.params[:, 0].tolist() == pytest.approx([0.7, 1.0, 0.0])


def test_rows_without_a_key_or_at_temperature_0_draft_the_argmax() -> None:
    assert DraftKeys.of(requests([PARAMS[1], PARAMS[0]], [3, None], [4, 4]), 2) is None
    keys = DraftKeys.of(requests([PARAMS[2], PARAMS[0]], [None, 3], [4, 4]), 2)
    assert keys.params.T.ravel().tolist() == pytest.approx([0.0, 1.0, 0.0, 0.7, 1.0, 0.0])  # argmax row: no filters
    logits = torch.randn(2, 50)
    assert torch.equal(DraftPicker(None, CPU)(logits, 0), logits.argmax(dim=-1))
    assert DraftPicker(keys, CPU)(logits, 1)[0] == logits[0].argmax()


def test_the_torch_path_draws_what_the_sampler_draws_from_the_same_logits() -> None:
    """On the target's own logits a draft is the verify row's sample: the same noise, the same processing."""
    logits = torch.randn(len(PARAMS), 300) * 3
    params, keys = draft_inputs(PARAMS)
    metadata = SamplingMetadata.build(PARAMS, 300, CPU, generators=_seeded_generators(SEEDS, POSITIONS, CPU))
    assert pick(logits, params, keys, None).tolist() == Sampler()(logits, metadata).sampled_token_ids.tolist()


def test_the_kernel_draws_what_the_sampler_kernel_draws_from_the_same_logits() -> None:
    pytest.importorskip("triton")
    from lamina.kernels import sampling
    from lamina.layers.sampler import sample_with_kernel
    logits = torch.randn(len(PARAMS), 96) * 3
    params, keys = draft_inputs(PARAMS)
    metadata = SamplingMetadata.build(PARAMS, 96, CPU, seeds=philox_keys(SEEDS, POSITIONS, step_key=7))
    assert pick(logits, params, keys, sampling).tolist() == sample_with_kernel(sampling, logits, metadata).tolist()


def test_ranked_drafts_are_picks_draft_then_the_argmax_order() -> None:
    """A tree node's children: `pick`'s draft (the argmax at temperature 0), then the argmax order without it, on the
    torch path and through the kernel; distinct tokens in every row."""
    from lamina.spec.draft_sampling import ranked
    logits = torch.randn(len(PARAMS), 96) * 3
    params, keys = draft_inputs(PARAMS)
    kernels = [None]
    if importlib.util.find_spec("triton") is not None:
        from lamina.kernels import sampling
        kernels.append(sampling)
    for kernel in kernels:
        got = ranked(logits, params, keys, 4, kernel)
        first = pick(logits, params, keys, kernel)
        assert got[:, 0].tolist() == first.tolist()
        for row, tokens in enumerate(got.tolist()):
            order = logits[row].topk(5).indices.tolist()
            assert tokens[1:] == [t for t in order if t != tokens[0]][:3] and len(set(tokens)) == 4
        assert got[1].tolist() == logits[1].topk(4).indices.tolist()  # temperature 0: the argmax order
    assert ranked(logits, params, keys, 1, None)[:, 0].tolist() == pick(logits, params, keys, None).tolist()


def test_a_draft_is_a_sample_of_q_accepted_as_the_coupling_says() -> None:
    """Over 4,000 keys: the drafts follow q (chi-square), and they equal the target's samples with probability
    sum_t 1 / sum_u max(p_u / p_t, q_u / q_t), above p(argmax q), the acceptance of an argmax draft."""
    n, temperature = 4000, 0.8
    p_logits, q_logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -1.0, 0.5]), torch.tensor([1.0, 2.2, 0.4, 0.9, -0.5, 0.0])
    params = [torch.full((n,), temperature), torch.ones(n), torch.zeros(n)]
    keys = torch.from_numpy(seeded_keys(list(range(n)), np.full(n, 17)))
    drafts = pick(q_logits.expand(n, -1).clone(), params, keys, None)
    samples = pick(p_logits.expand(n, -1).clone(), params, keys, None)
    p, q = (p_logits / temperature).softmax(0), (q_logits / temperature).softmax(0)
    counts = Counter(drafts.tolist())
    stat = sum((counts[t] - n * q[t].item()) ** 2 / (n * q[t].item()) for t in range(6))
    assert stat < chi2_critical(5), (stat, counts)
    agree = (1 / torch.maximum(p[None, :] / p[:, None], q[None, :] / q[:, None]).sum(1)).sum().item()
    rate = (drafts == samples).float().mean().item()
    assert abs(rate - agree) < 4 * (agree * (1 - agree) / n) ** 0.5, (rate, agree)
    assert agree > p[q.argmax()].item() + 0.1

"""Sampler tests: exact distributions (chi-square), penalties, min_tokens, seeds, logprobs."""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from lamina.bench.sampling import chi2_critical
from lamina.engine.request import Request
from lamina.layers.sampler import (Sampler, SamplerOutput, exponential_noise, process_logits,
                                   to_logprob_dicts)
from lamina.sampling_params import SamplingParams
from tests.helpers.sampling import metadata_for

CPU = torch.device("cpu")
LOGITS8 = [1.2, 0.3, 2.0, -0.5, 0.9, -1.5, 1.6, 0.0]
NUM_SAMPLES = 20_000


def make_request(rid: str, params: SamplingParams, prompt: list[int] | None = None,
                 output: list[int] | None = None, eos: frozenset[int] = frozenset()) -> Request:
    req = Request(request_id=rid, prompt_token_ids=list(prompt or [0]), sampling_params=params,
                  eos_token_ids=eos)
    req.append_output_token_ids(list(output or []))
    return req


def run_sampler(logits: torch.Tensor, requests: list[Request],
                generators: dict[str, torch.Generator] | None = None, seed: int = 0) -> SamplerOutput:
    md = metadata_for(requests, generators or {}, logits.shape[1], CPU)
    return Sampler(torch.Generator().manual_seed(seed))(logits, md)


# ---------------------------------------------------------------- exact reference distributions

def ref_dist(logits: list[float], temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             min_p: float = 0.0) -> torch.Tensor:
    """float64, step by step: temperature, top-k, top-p (smallest prefix reaching p), min-p."""
    probs = (torch.tensor(logits, dtype=torch.float64) / temperature).softmax(0)
    order = probs.argsort(descending=True).tolist()
    if top_k > 0:
        probs[order[top_k:]] = 0.0
        probs /= probs.sum()
    if top_p < 1.0:
        total, keep = 0.0, 0
        while total < top_p:
            total += probs[order[keep]].item()
            keep += 1
        probs[order[keep:]] = 0.0
        probs /= probs.sum()
    if min_p > 0.0:
        probs[probs < min_p * probs.max()] = 0.0
        probs /= probs.sum()
    return probs


def chi2_stat(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's statistic; infinite when a sample falls where the expected probability is 0."""
    n = counts.sum().item()
    support = expected > 0
    if counts[~support].sum() > 0:
        return math.inf
    exp = expected[support] * n
    return (((counts[support].double() - exp) ** 2) / exp).sum().item()


def accepts(counts: torch.Tensor, expected: torch.Tensor) -> bool:
    df = int((expected > 0).sum()) - 1
    return chi2_stat(counts, expected) < chi2_critical(df)


def sample_counts(params: SamplingParams, n: int = NUM_SAMPLES, shift: float = 0.0) -> torch.Tensor:
    logits = torch.tensor([LOGITS8] * n) + shift
    requests = [make_request(f"r{i}", params) for i in range(n)]
    tokens = run_sampler(logits, requests).sampled_token_ids
    return torch.bincount(tokens, minlength=len(LOGITS8))


def test_chi2_critical_matches_table() -> None:
    assert chi2_critical(7) == pytest.approx(24.322, abs=1e-2)
    assert chi2_critical(3) == pytest.approx(16.266, abs=1e-2)


DIST_CASES = [  # (params, exact reference kwargs, a wrong reference the test must reject)
    (dict(temperature=0.7), dict(temperature=0.7), dict(temperature=1.0)),
    (dict(temperature=1.0), dict(), dict(temperature=0.85)),
    (dict(top_k=3), dict(top_k=3), dict(top_k=4)),
    (dict(top_p=0.8), dict(top_p=0.8), dict(top_p=0.7)),
    (dict(min_p=0.3), dict(min_p=0.3), dict(min_p=0.1)),
    # each stage removes tokens here: top-k {3, 5}, then top-p {7}, then min-p {1}
    (dict(temperature=1.3, top_k=6, top_p=0.9, min_p=0.3),
     dict(temperature=1.3, top_k=6, top_p=0.9, min_p=0.3), dict(temperature=1.3, top_k=6, top_p=0.9)),
]


@pytest.mark.parametrize("params,exact,wrong", DIST_CASES)
def test_distribution_matches_exact(params: dict, exact: dict, wrong: dict) -> None:
    counts = sample_counts(SamplingParams(**params))
    expected = ref_dist(LOGITS8, **exact)
    assert counts[expected == 0].sum() == 0  # never outside the support
    assert accepts(counts, expected)
    assert not accepts(counts, ref_dist(LOGITS8, **wrong))  # the bound has teeth


def test_large_logits_are_stable() -> None:
    """Softmax is shift invariant: logits around 500 must sample exactly like the originals."""
    counts = sample_counts(SamplingParams(temperature=0.7, min_p=0.05), n=5000, shift=500.0)
    assert accepts(counts, ref_dist(LOGITS8, temperature=0.7, min_p=0.05))


def test_tiny_top_p_keeps_the_top_token() -> None:
    counts = sample_counts(SamplingParams(top_p=1e-9), n=500)
    assert counts[2] == 500


def test_exponential_noise_is_exp1() -> None:
    """The race's noise: P(q > t) = e^-t within 5 sigma at several t over 200,000 draws, in the rows of the shared
    generator and in a row with its own (a uniform, or a law with another rate, would fail), q >= 0; the same
    generator state gives the same draws, whatever the other rows."""
    like = torch.empty(3, 200_000)
    q = exponential_noise(like, {1: torch.Generator().manual_seed(7)}, torch.Generator().manual_seed(8))
    assert q.shape == like.shape and q.dtype == like.dtype and (q >= 0).all()
    for row in (0, 1):
        for t in (0.05, 0.5, 1.0, 2.0, 4.0):
            tail, exact = (q[row] > t).double().mean().item(), math.exp(-t)
            assert abs(tail - exact) < 5 * math.sqrt(exact * (1 - exact) / q.shape[1]), (row, t, tail, exact)
    alone = exponential_noise(like[:1], {0: torch.Generator().manual_seed(7)}, None)
    assert torch.equal(alone[0], q[1])


def test_seeded_rows_distribution() -> None:
    """Each row has its own generator: the draws across seeds follow the exact distribution."""
    n = 4000
    params = [SamplingParams(temperature=0.9, seed=1000 + i) for i in range(n)]
    requests = [make_request(f"s{i}", p) for i, p in enumerate(params)]
    gens = {r.request_id: torch.Generator().manual_seed(r.sampling_params.seed) for r in requests}
    tokens = run_sampler(torch.tensor([LOGITS8] * n), requests, gens).sampled_token_ids
    counts = torch.bincount(tokens, minlength=8)
    assert accepts(counts, ref_dist(LOGITS8, temperature=0.9))
    assert not accepts(counts, ref_dist(LOGITS8, temperature=1.3))


def test_mixed_greedy_and_random_rows() -> None:
    n = 10_000
    requests = [make_request(f"r{i}", SamplingParams(temperature=0.0 if i % 2 else 1.0)) for i in range(n)]
    tokens = run_sampler(torch.tensor([LOGITS8] * n), requests).sampled_token_ids
    assert (tokens[1::2] == 2).all()
    counts = torch.bincount(tokens[0::2], minlength=8)
    assert accepts(counts, ref_dist(LOGITS8))


@pytest.mark.parametrize("params", [dict(top_k=5), dict(top_p=0.5), dict(min_p=0.3),
                                    dict(top_k=10, top_p=0.7, temperature=1.5)])
def test_never_samples_outside_support(params: dict) -> None:
    torch.manual_seed(3)
    n, vocab = 3000, 64
    row = (torch.randn(vocab) * 1.5).tolist()
    requests = [make_request(f"r{i}", SamplingParams(**params)) for i in range(n)]
    tokens = run_sampler(torch.tensor([row] * n), requests).sampled_token_ids
    support = ref_dist(row, **params) > 0
    assert support[tokens].all()
    assert len(set(tokens.tolist())) > 1


def test_top_k_keeps_ties_at_kth_value() -> None:
    row = [3.0, 2.0, 2.0, 2.0, 0.0, -1.0]
    requests = [make_request(f"r{i}", SamplingParams(top_k=2)) for i in range(2000)]
    tokens = run_sampler(torch.tensor([row] * 2000), requests).sampled_token_ids
    assert set(tokens.tolist()) == {0, 1, 2, 3}


def test_top_p_keeps_ties_at_the_boundary() -> None:
    """p(2.0) = 0.534 < 0.6: the next value, 1.0, stays, and so does its tie (the mass strictly above
    either is 0.534); 0.0 is out. A position-based cut would keep only one of the tied tokens."""
    row = [2.0, 1.0, 1.0, 0.0]
    requests = [make_request(f"r{i}", SamplingParams(top_p=0.6)) for i in range(2000)]
    tokens = run_sampler(torch.tensor([row] * 2000), requests).sampled_token_ids
    assert set(tokens.tolist()) == {0, 1, 2}


# ---------------------------------------------------------------- greedy

def test_greedy_is_argmax_and_draws_no_randomness() -> None:
    torch.manual_seed(0)
    logits = torch.randn(16, 100)
    requests = [make_request(f"r{i}", SamplingParams(temperature=0.0, top_k=3, top_p=0.5))
                for i in range(16)]
    md = metadata_for(requests, {}, 100, CPU)
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    out = Sampler(gen)(logits, md)
    assert md.all_greedy and not md.all_random and md.greedy_mask is None
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.logprobs is None
    assert torch.equal(gen.get_state(), state)


def test_greedy_tokens_take_the_triton_argmax_only_for_cuda_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU logits: torch.argmax, no triton imported for them; the kernel module loads where triton is installed
    (lamina.kernels.argmax: its interpreter tests are tests/kernels/test_argmax.py)."""
    from lamina.layers import sampler

    logits = torch.randn(3, 50)
    asked: list[bool] = []
    with monkeypatch.context() as patch:
        patch.setattr(sampler, "_load_argmax_kernel", lambda: asked.append(True))
        assert torch.equal(sampler.greedy_tokens(logits), logits.argmax(-1))
    assert not asked  # never asked for on the CPU
    pytest.importorskip("triton")
    assert sampler._load_argmax_kernel() is not None and hasattr(sampler._load_argmax_kernel(), "argmax")


# ---------------------------------------------------------------- penalties and min_tokens

def ref_penalized(row: list[float], prompt: list[int], output: list[int], p: SamplingParams) -> list[float]:
    out = list(row)
    for t in set(prompt) | set(output):
        out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    for t, c in Counter(output).items():
        out[t] -= p.frequency_penalty * c + p.presence_penalty
    return out


PENALTY_PARAMS = [
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(frequency_penalty=0.5, presence_penalty=-0.7),
    SamplingParams(repetition_penalty=0.8, frequency_penalty=-1.1, presence_penalty=1.5),
    SamplingParams(),
    SamplingParams(temperature=0.0, repetition_penalty=2.0, presence_penalty=0.4),
    SamplingParams(frequency_penalty=1.0),
]


def test_penalties_match_per_row_formulas() -> None:
    gen = torch.Generator().manual_seed(1)
    vocab = 50
    logits = torch.randn(len(PENALTY_PARAMS), vocab, generator=gen) * 3
    requests = []
    for i, params in enumerate(PENALTY_PARAMS):
        prompt = torch.randint(0, vocab, (12,), generator=gen).tolist()
        output = torch.randint(0, vocab, (i * 3,), generator=gen).tolist()
        requests.append(make_request(f"r{i}", params, prompt, output))
    raw = logits.clone()
    md = metadata_for(requests, {}, vocab, CPU)
    got = process_logits(logits, md)
    want = torch.tensor([ref_penalized(logits[i].tolist(), r.prompt_token_ids, r.output_token_ids,
                                       r.sampling_params) for i, r in enumerate(requests)])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(logits, raw)  # the input is not modified
    assert not torch.equal(got, raw)


def test_penalties_skipped_when_unused() -> None:
    requests = [make_request("a", SamplingParams(), [1, 2], [3]), make_request("b", SamplingParams(top_k=2))]
    md = metadata_for(requests, {}, 8, CPU)
    assert md.no_penalties and md.min_tokens is None and md.top_p is None and md.min_p is None
    md = metadata_for([make_request("c", SamplingParams(presence_penalty=1.0))], {}, 8, CPU)
    assert md.penalties is not None and md.penalties.prompt_token_mask is None


def test_penalty_changes_greedy_choice() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.9, 0.5]])
    req = make_request("r", SamplingParams(temperature=0.0, repetition_penalty=1.2), prompt=[1])
    assert run_sampler(logits, [req]).sampled_token_ids.tolist() == [2]
    req = make_request("r", SamplingParams(temperature=0.0))
    assert run_sampler(logits, [req]).sampled_token_ids.tolist() == [1]


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    row = [0.0, 0.5, 5.0, 0.1, 0.2, 4.0, 0.3, 3.0, 0.0, 0.0]  # EOS 2 best, stop id 5 next, then 7
    eos = frozenset({2})
    for n_out, want in [(0, 7), (1, 7), (2, 7), (3, 2), (4, 2)]:
        params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[5])
        req = make_request("r", params, output=[0] * n_out, eos=eos)
        assert run_sampler(torch.tensor([row]), [req]).sampled_token_ids.tolist() == [want]
    ignore = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[2, 5, 99], ignore_eos=True)
    req = make_request("r", ignore, eos=frozenset({7}))
    md = metadata_for([req], {}, len(row), CPU)
    got = process_logits(torch.tensor([row]), md)[0]
    masked = [i for i, v in enumerate(got.tolist()) if v == float("-inf")]
    assert masked == [2, 5]  # stop ids only: EOS 7 ignored, 99 is outside the vocabulary
    assert run_sampler(torch.tensor([row]), [req]).sampled_token_ids.tolist() == [7]


def test_min_tokens_random_rows_never_sample_banned() -> None:
    row = [2.0, 0.0, 2.5, 0.0, 0.0, 2.2, 0.0, 0.0]
    n = 2000
    requests = [make_request(f"r{i}", SamplingParams(min_tokens=1, stop_token_ids=[5]), eos=frozenset({2}))
                for i in range(n)]
    tokens = set(run_sampler(torch.tensor([row] * n), requests).sampled_token_ids.tolist())
    assert 2 not in tokens and 5 not in tokens and 0 in tokens


# ---------------------------------------------------------------- seeds

def seeded_tokens(steps: list[torch.Tensor], position: int, others: list[SamplingParams]) -> list[int]:
    """Run request A (seed 1234) for len(steps) steps, at `position` among requests with `others`."""
    a_params = SamplingParams(temperature=0.9, top_p=0.95, frequency_penalty=0.3, seed=1234)
    a = make_request("A", a_params, prompt=[1, 2, 3])
    rest = [make_request(f"o{i}", p, prompt=[4, 5]) for i, p in enumerate(others)]
    gens = {r.request_id: torch.Generator().manual_seed(r.sampling_params.seed)
            for r in [a, *rest] if r.sampling_params.seed is not None}
    noise = torch.Generator().manual_seed(7 + position)
    tokens = []
    for step, a_logits in enumerate(steps):
        batch = rest[:position] + [a] + rest[position:]
        logits = torch.randn(len(batch), a_logits.shape[0], generator=noise)
        logits[position] = a_logits
        out = run_sampler(logits, batch, gens, seed=100 + step + position)
        tokens.append(out.sampled_token_ids[position].item())
        for i, req in enumerate(batch):
            req.append_output_token_ids([out.sampled_token_ids[i].item()])
    return tokens


def test_seeded_request_independent_of_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    steps = [torch.randn(500, generator=gen) * 0.5 for _ in range(6)]
    alone = seeded_tokens(steps, 0, [])
    others = [SamplingParams(seed=99, top_k=50), SamplingParams(), SamplingParams(temperature=0.0),
              SamplingParams(min_p=0.05, repetition_penalty=1.5, logprobs=3),
              SamplingParams(seed=1234, temperature=0.5)]
    assert len(set(alone)) > 1
    for position in (0, 2, 5):
        assert seeded_tokens(steps, position, others) == alone
    assert seeded_tokens(steps, 0, []) == alone  # deterministic


def test_seed_without_generator_is_an_error() -> None:
    req = make_request("r", SamplingParams(seed=3))
    with pytest.raises(ValueError, match="generator"):
        metadata_for([req], {}, 8, CPU)


def test_penalty_token_out_of_range_is_an_error() -> None:
    req = make_request("r", SamplingParams(repetition_penalty=1.1), prompt=[3, 8])
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        metadata_for([req], {}, 8, CPU)


# ---------------------------------------------------------------- logprobs

def test_logprobs_are_of_raw_logits() -> None:
    gen = torch.Generator().manual_seed(2)
    vocab = 40
    logits = torch.randn(4, vocab, generator=gen) * 2
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=1.0),
              SamplingParams(logprobs=0, temperature=0.5, min_tokens=2, stop_token_ids=[1]),
              SamplingParams(logprobs=3, presence_penalty=2.0, top_k=4),
              SamplingParams(logprobs=5, temperature=0.0)]
    requests = [make_request(f"r{i}", p, prompt=[1, 2, 3], output=[4, 5]) for i, p in enumerate(params)]
    out = run_sampler(logits, requests)
    lp = out.logprobs
    assert lp is not None and lp.top_ids.shape == (4, 5)
    want = logits.double().log_softmax(-1)
    top = want.topk(5, dim=-1)
    assert torch.equal(lp.top_ids, top.indices)
    torch.testing.assert_close(lp.top_logprobs.double(), top.values, rtol=0, atol=1e-5)
    sampled = out.sampled_token_ids
    chosen = want.gather(1, sampled[:, None])
    torch.testing.assert_close(lp.sampled_logprob.double(), chosen[:, 0], rtol=0, atol=1e-5)
    assert torch.equal(lp.sampled_rank, (want > chosen).sum(-1) + 1)
    assert lp.sampled_rank[3].item() == 1  # greedy, no penalties: the most likely token

    dicts = to_logprob_dicts(lp, sampled, [p.logprobs for p in params])
    assert dicts[0] is None
    assert list(dicts[1]) == [sampled[1].item()]
    assert dicts[1][sampled[1].item()].rank == lp.sampled_rank[1].item()
    row2 = dicts[2]
    assert set(row2) == {sampled[2].item(), *top.indices[2, :3].tolist()}
    for rank, token in enumerate(top.indices[2, :3].tolist(), start=1):
        assert row2[token].rank == rank
        assert row2[token].logprob == pytest.approx(want[2, token].item(), abs=1e-5)

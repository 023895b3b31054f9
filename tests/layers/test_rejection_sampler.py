"""RejectionSampler: greedy semantics, layout, exactness of the emitted distribution (chi-square), seeds."""
from __future__ import annotations

import pytest
import torch

from lamina.bench.sampling import chi2_critical
from lamina.layers.rejection_sampler import RejectionSampler, VerifyOutput
from lamina.layers.sampler import Sampler
from lamina.layers.sampling_metadata import SamplingMetadata, min_tokens_mask, penalty_tensors
from lamina.sampling_params import SamplingParams
from tests.layers.test_sampler import ref_dist as target  # the exact target distribution

CPU = torch.device("cpu")
LOGITS8 = [1.2, 0.3, 2.0, -0.5, 0.9, -1.5, 1.6, 0.0]
BONUS8 = [-0.4, 1.5, 0.2, 1.1, -1.0, 0.6, 0.1, 2.2]
DRAFT8 = [0.1, 1.8, -0.3, 0.7, 1.4, 0.5, -1.0, 0.9]  # a draft model that disagrees with the target
TRIALS = 20_000
GREEDY = SamplingParams(temperature=0.0)


def verify(logits: torch.Tensor, k: list[int], drafts: list[int] | torch.Tensor, params: list[SamplingParams],
           generators: dict[int, torch.Generator] | None = None, draft_probs: torch.Tensor | None = None,
           seed: int = 0) -> VerifyOutput:
    md = SamplingMetadata.build(params, logits.shape[1], CPU, generators=generators or {})
    drafts = torch.as_tensor(drafts, dtype=torch.int64)
    return RejectionSampler(torch.Generator().manual_seed(seed))(logits, k, drafts, md, draft_probs)


def accepts(tokens: torch.Tensor, expected: torch.Tensor) -> bool:
    """Chi-square at alpha = 1e-3; never any sample where the expected probability is 0."""
    counts = torch.bincount(tokens, minlength=expected.numel()).double()
    support = expected > 0
    if counts[~support].sum() > 0:
        return False
    exp = expected[support] * counts.sum()
    stat = (((counts[support] - exp) ** 2) / exp).sum().item()
    return stat < chi2_critical(int(support.sum()) - 1)


def repeated(rows: list[list[float]], n: int) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).repeat(n, 1)


# ---------------------------------------------------------------- greedy and layout

ROWS = torch.tensor([[0.0, 3.0, 1.0, 0.0], [2.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 4.0], [0.0, 1.0, 5.0, 0.0]])


@pytest.mark.parametrize("drafts,expected,accepted", [
    ([1, 0, 3], [1, 0, 3, 2], 3),  # all accepted: the bonus row's argmax
    ([1, 2, 3], [1, 0, -1, -1], 1),  # rejected at j = 1: that row's argmax, then padding
    ([0, 0, 3], [1, -1, -1, -1], 0),
])
def test_greedy_is_argmax(drafts: list[int], expected: list[int], accepted: int) -> None:
    gen = torch.Generator().manual_seed(1)
    state = gen.get_state()
    md = SamplingMetadata.build([GREEDY], 4, CPU)
    out = RejectionSampler(gen)(ROWS, [3], torch.tensor(drafts), md)
    assert out.token_ids.tolist() == [expected] and out.num_accepted.tolist() == [accepted]
    assert torch.equal(gen.get_state(), state)  # all greedy: no randomness drawn


def test_padding_and_requests_without_drafts() -> None:
    logits = torch.cat([ROWS, ROWS[3:], ROWS[:2]])  # k = 3, 0, 1
    out = verify(logits, [3, 0, 1], [1, 0, 3, 1], [GREEDY] * 3)
    assert out.token_ids.tolist() == [[1, 0, 3, 2], [2, -1, -1, -1], [1, 0, -1, -1]]
    assert out.num_accepted.tolist() == [3, 0, 1]
    out = verify(ROWS[:2], [0, 0], [], [GREEDY, SamplingParams(top_k=1)])
    assert out.token_ids.tolist() == [[1], [0]] and out.num_accepted.tolist() == [0, 0]


def test_mixed_batch_of_greedy_random_and_no_drafts() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 8, generator=gen) * 3  # rows: request 0: 0..2, 1: 3..6, 2: 7, 3: 8
    argmax = logits.argmax(-1).tolist()
    random_params = {1: dict(temperature=0.8, top_k=3), 2: dict(top_p=0.7)}
    params = [GREEDY, SamplingParams(**random_params[1]), SamplingParams(**random_params[2]), GREEDY]
    drafts = [argmax[0], (argmax[1] + 1) % 8, 2, 3, 4]
    out = verify(logits, [2, 3, 0, 0], drafts, params)
    assert out.token_ids.shape == (4, 4)
    assert out.token_ids[0].tolist() == [argmax[0], argmax[1], -1, -1]
    assert out.token_ids[3].tolist() == [argmax[8], -1, -1, -1]
    assert out.num_accepted[[0, 3]].tolist() == [1, 0]
    for i, first_row, first_draft in [(1, 3, 2), (2, 7, 5)]:  # accepted drafts, a token of the row's support, -1
        a, row = int(out.num_accepted[i]), out.token_ids[i].tolist()
        assert row[:a] == drafts[first_draft:first_draft + a] and all(t == -1 for t in row[a + 1:])
        assert target(logits[first_row + a].tolist(), **random_params[i])[row[a]] > 0


# ---------------------------------------------------------------- exactness

def first_tokens(params: SamplingParams, draft: int | None = None, q: list[float] | None = None,
                 seeded: bool = False) -> VerifyOutput:
    """TRIALS requests with one draft each: a fixed one-hot `draft`, or a draft sampled from softmax(q)."""
    draft_probs = None
    if q is None:
        drafts = torch.full((TRIALS,), draft)
    else:
        draft_probs = torch.tensor(q).softmax(0).repeat(TRIALS, 1)
        drafts = torch.multinomial(draft_probs, 1, generator=torch.Generator().manual_seed(7)).squeeze(1)
    gens = {i: torch.Generator().manual_seed(100 + i) for i in range(TRIALS)} if seeded else None
    return verify(repeated([LOGITS8, BONUS8], TRIALS), [1] * TRIALS, drafts, [params] * TRIALS, gens, draft_probs)


PARAMS = [dict(), dict(temperature=0.7, top_p=0.8), dict(temperature=1.3, top_k=4), dict(min_p=0.2)]


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("draft", [2, 4, 5])  # the most likely token, a middle one, the least likely (often
# outside the kept set)
def test_one_hot_draft_first_token_is_exact(params: dict, draft: int) -> None:
    out = first_tokens(SamplingParams(**params), draft=draft)
    p = target(LOGITS8, **params)
    assert accepts(out.token_ids[:, 0], p)
    # the bound has teeth: resampling from p itself (the draft not removed) is visibly off
    wrong = p * (1 - p[draft])
    wrong[draft] += p[draft]
    assert p[draft] == 0 or not accepts(out.token_ids[:, 0], wrong)


@pytest.mark.parametrize("params", PARAMS)
def test_draft_model_first_token_is_exact(params: dict) -> None:
    out = first_tokens(SamplingParams(**params), q=DRAFT8)
    p, q = target(LOGITS8, **params), torch.tensor(DRAFT8, dtype=torch.float64).softmax(0)
    assert accepts(out.token_ids[:, 0], p)
    accept = torch.minimum(p, q)  # the same proposal, resampled from p instead of the residual
    assert not accepts(out.token_ids[:, 0], accept + (1 - accept.sum()) * p)


def test_draft_model_equal_to_the_target_is_always_accepted() -> None:
    out = first_tokens(SamplingParams(), q=LOGITS8)
    assert out.num_accepted.float().mean() > 0.999


@pytest.mark.parametrize("params", [dict(), dict(temperature=0.7, top_k=5)])
@pytest.mark.parametrize("use_q", [False, True])
def test_bonus_token_after_an_accepted_draft_is_exact(params: dict, use_q: bool) -> None:
    out = first_tokens(SamplingParams(**params), draft=2, q=DRAFT8 if use_q else None)
    bonus = out.token_ids[out.num_accepted == 1, 1]
    assert bonus.numel() > 3000 and (out.token_ids[out.num_accepted == 0, 1] == -1).all()
    assert accepts(bonus, target(BONUS8, **params))
    assert not accepts(bonus, target(LOGITS8, **params))


def test_every_position_of_a_chain_is_exact() -> None:
    """k = 3 one-hot drafts of likely tokens: the token at position j, given j accepted drafts, follows p_j."""
    rows = [[2 * x for x in LOGITS8], [2 * x for x in BONUS8], [2 * x for x in LOGITS8[::-1]], BONUS8]
    drafts = torch.tensor([2, 7, 5]).repeat(TRIALS)
    out = verify(repeated(rows, TRIALS), [3] * TRIALS, drafts, [SamplingParams()] * TRIALS)
    for j, row in enumerate(rows):
        reached = out.num_accepted >= j
        assert reached.sum() > 2000
        assert accepts(out.token_ids[reached, j], target(row))


def test_seeded_requests_are_exact_too() -> None:
    out = first_tokens(SamplingParams(temperature=0.9, seed=1), draft=6, seeded=True)
    assert accepts(out.token_ids[:, 0], target(LOGITS8, temperature=0.9))


# ---------------------------------------------------------------- seeds

def seeded_run(batch: str, seed: int) -> tuple[list[int], int]:
    """Request S (seed 42, k = 3) alone or in a batch; returns its tokens and accepted count."""
    rows = [LOGITS8, BONUS8, LOGITS8[::-1], BONUS8[::-1]]
    s_params = SamplingParams(temperature=1.1, top_k=6, seed=42)
    if batch == "alone":
        k, logits, drafts, params, where = [3], rows, [2, 7, 0], [s_params], 0
    else:
        k = [1, 0, 3, 2]
        logits = [BONUS8, LOGITS8, DRAFT8] + rows + [DRAFT8, LOGITS8, BONUS8]
        drafts, where = [4, 2, 7, 0, 1, 1], 2
        params = [SamplingParams(), GREEDY, s_params, SamplingParams(top_p=0.9, seed=5)]
    gens = {where: torch.Generator().manual_seed(42)}
    if batch != "alone":
        gens[3] = torch.Generator().manual_seed(5)
    out = verify(torch.tensor(logits), k, drafts, params, gens, seed=seed)
    return out.token_ids[where, :4].tolist(), int(out.num_accepted[where])


def test_seeded_requests_are_reproducible_and_batch_independent() -> None:
    """Whatever the shared generator draws (20 seeds) and whatever the batch, S's accept/reject decisions
    and tokens are the same; its first draft is accepted about half the time, so a uniform drawn from the
    shared generator would show."""
    alone = seeded_run("alone", seed=0)
    for seed in range(1, 21):
        assert seeded_run("alone", seed=seed) == alone
        assert seeded_run("batch", seed=seed) == alone


def test_seeded_request_without_drafts_draws_like_the_sampler() -> None:
    params = SamplingParams(temperature=0.8, seed=9)
    logits = torch.tensor([LOGITS8])
    for seed in range(5):
        md = SamplingMetadata.build([params], 8, CPU, generators={0: torch.Generator().manual_seed(seed)})
        sampled = Sampler()(logits, md).sampled_token_ids.item()
        out = verify(logits, [0], [], [params], {0: torch.Generator().manual_seed(seed)})
        assert out.token_ids.tolist() == [[sampled]]


# ---------------------------------------------------------------- validation

def test_penalties_and_min_tokens_are_refused() -> None:
    params = [SamplingParams(repetition_penalty=1.2, min_tokens=2, max_tokens=5)]
    pen = penalty_tensors(params, [[1]], [[]], 8, CPU)
    mask = min_tokens_mask(params, [0], [frozenset({3})], 8, CPU)
    for md in (SamplingMetadata.build(params, 8, CPU, penalties=pen),
               SamplingMetadata.build(params, 8, CPU, min_tokens=mask)):
        with pytest.raises(ValueError, match="penalties and min_tokens"):
            RejectionSampler()(torch.zeros(2, 8), [1], torch.tensor([0]), md)


@pytest.mark.parametrize("rows,k,drafts,q_rows,field", [
    (3, [1], [0], None, "logits"),
    (2, [-1], [], None, "num_draft_tokens"),
    (2, [1], [0, 1], None, "draft_token_ids"),
    (2, [1], [0], 2, "draft_probs"),
])
def test_shape_errors_name_the_field(rows: int, k: list[int], drafts: list[int], q_rows: int | None,
                                     field: str) -> None:
    q = None if q_rows is None else torch.full((q_rows, 8), 1 / 8)
    md = SamplingMetadata.build([SamplingParams()], 8, CPU)
    with pytest.raises(ValueError, match=field):
        RejectionSampler()(torch.zeros(rows, 8), k, torch.tensor(drafts, dtype=torch.int64), md, q)

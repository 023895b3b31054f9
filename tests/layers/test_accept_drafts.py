"""accept_drafts: drafts kept while they equal the samples, then one sample more; and that this is exact
rejection sampling for one-hot proposals (each emitted token is distributed as the target)."""
from __future__ import annotations

import torch
from scipy.stats import chisquare

from lamina.layers.accept_drafts import accept_drafts


def _reference(sampled: list[int], num_drafts: list[int], drafts: list[int]) -> list[list[int]]:
    out, start, flat = [], 0, 0
    for k in num_drafts:
        samples, proposed = sampled[start:start + k + 1], drafts[flat:flat + k]
        a = next((j for j in range(k) if samples[j] != proposed[j]), k)
        out.append(samples[:a + 1])
        start, flat = start + k + 1, flat + k
    return out


def test_keeps_the_equal_prefix_then_one_sample() -> None:
    sampled = [5, 6, 7, 8, 1, 2, 9, 3, 3, 3]  # requests with 3, 0, 1 and 2 drafts
    num_drafts, drafts = [3, 0, 1, 2], [5, 6, 0, 2, 3, 3]
    got = accept_drafts(sampled, num_drafts, drafts)
    assert got == _reference(sampled, num_drafts, drafts) == [[5, 6, 7], [1], [2, 9], [3, 3, 3]]


def test_random_cases_match_the_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        num_drafts = torch.randint(0, 5, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen).tolist()
        sampled = torch.randint(0, 3, (sum(num_drafts) + len(num_drafts),), generator=gen)
        drafts = torch.randint(0, 3, (sum(num_drafts),), generator=gen).tolist()
        sampled = sampled.tolist()
        assert accept_drafts(sampled, num_drafts, drafts) == _reference(sampled, num_drafts, drafts)


def test_the_second_token_is_distributed_as_the_target() -> None:
    """Two positions, the second's distribution depending on the first token: the emitted pair's law must be
    p(x) p(y | x) whatever the one-hot drafts are (here always 1, 1)."""
    p_first = torch.tensor([0.5, 0.3, 0.2])
    p_second = torch.tensor([[0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.8, 0.1, 0.1]])  # given the first token
    n, gen = 60_000, torch.Generator().manual_seed(1)
    first = torch.multinomial(p_first, n, replacement=True, generator=gen)
    # row 1 of a request is sampled after draft 1 (the verifier conditions on the draft, not on the sample)
    second = torch.multinomial(p_second[1], n, replacement=True, generator=gen)
    third = torch.multinomial(p_second[1], n, replacement=True, generator=gen)  # the bonus row: unused here
    sampled = torch.stack([first, second, third], dim=1).ravel().tolist()
    tokens = accept_drafts(sampled, [2] * n, [1, 1] * n)
    out = torch.tensor([t + [-1] * (3 - len(t)) for t in tokens])
    emitted_first = out[:, 0]
    counts = torch.bincount(emitted_first, minlength=3).double()
    assert chisquare(counts.numpy(), (p_first.double() * n).numpy()).pvalue > 1e-3
    kept = out[:, 1] >= 0  # a second token is emitted only after the first draft was accepted
    assert torch.equal(kept, emitted_first == 1)
    pairs = torch.bincount(out[kept, 1], minlength=3).double()
    expected = p_second[1].double() / p_second[1].double().sum() * float(kept.sum())
    assert chisquare(pairs.numpy(), expected.numpy()).pvalue > 1e-3

"""NgramProposer: exact drafts on hand-made sequences, validation, and a brute-force reference."""
from __future__ import annotations

import random

import numpy as np
import pytest

from lamina.spec.ngram import NgramProposer
from lamina.spec.proposer import Proposer


def reference(tokens: list[int], k: int, n_min: int, n_max: int, max_drafts: int,
              up_to: int = 8) -> tuple[list[int], int]:
    """Plain Python: longest n first, then the most recent occurrence ending before the last token; the drafts,
    and how far back that occurrence agrees with the sequence's end (at most `up_to`; 0 without drafts)."""
    length, limit = len(tokens), min(k, max_drafts)
    if limit == 0:
        return [], 0
    for n in range(n_max, n_min - 1, -1):
        suffix = tokens[length - n:] if n < length else None
        for start in range(length - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                end, m = start + n - 1, 0
                while m < up_to and end - m >= 0 and tokens[end - m] == tokens[length - 1 - m]:
                    m += 1
                return tokens[start + n:start + n + limit], m
    return [], 0


def propose_one(tokens: list[int], k: int = 3, n_min: int = 1, n_max: int = 4, max_drafts: int = 8) -> list[int]:
    return NgramProposer(k, n_min, n_max).propose([tokens], [max_drafts])[0]


def test_is_a_proposer() -> None:
    assert isinstance(NgramProposer(2), Proposer)


def test_docstring_example() -> None:
    assert propose_one([4, 7, 8, 9, 3, 7, 8, 5, 7, 8]) == [5, 7, 8]


def test_longest_n_is_preferred_over_a_more_recent_shorter_match() -> None:
    # [1 2 3] occurs at 0..2 (followed by 10); [2 3] alone occurs later at 5..6 (followed by 20)
    tokens = [1, 2, 3, 10, 11, 2, 3, 20, 21, 1, 2, 3]
    assert propose_one(tokens, k=2) == [10, 11]
    assert propose_one(tokens, k=2, n_max=2) == [20, 21]


def test_most_recent_occurrence_is_preferred() -> None:
    tokens = [5, 6, 1, 5, 6, 2, 5, 6, 3, 9, 5, 6]
    assert propose_one(tokens, k=1) == [3]


def test_cut_at_max_drafts_and_k() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert propose_one(tokens, k=4) == [3, 4, 5, 6]
    assert propose_one(tokens, k=4, max_drafts=2) == [3, 4]
    assert propose_one(tokens, k=2, max_drafts=8) == [3, 4]
    assert propose_one(tokens, k=4, max_drafts=0) == []


def test_cut_at_the_sequence_end() -> None:
    assert propose_one([1, 2, 9, 1, 2], k=5) == [9, 1, 2]
    assert propose_one([1, 1, 1, 1], k=5) == [1]  # overlapping 3-gram at 0..2 matches 1..3


def test_no_match() -> None:
    assert propose_one([1, 2, 3, 4]) == []
    assert propose_one([7]) == []
    assert propose_one([]) == []


def test_the_suffix_never_matches_itself() -> None:
    assert propose_one([3, 4], n_min=2, n_max=2) == []
    assert propose_one([9, 3, 4], n_min=1, n_max=4) == []
    assert propose_one([4, 4]) == [4]  # the earlier 4 is an occurrence, the last one is not


def test_min_and_max_bounds() -> None:
    tokens = [1, 2, 3, 7, 8, 3]  # only a 1-gram match: [3] at 2, followed by [7 8]
    assert propose_one(tokens, n_min=1, n_max=4) == [7, 8, 3]
    assert propose_one(tokens, n_min=2, n_max=4) == []
    tokens = [1, 2, 3, 4, 0, 1, 2, 3, 4]  # a 4-gram match, which n_max = 2 must not see as such
    assert propose_one(tokens, k=1, n_min=2, n_max=2) == [0]
    assert propose_one(tokens, k=1, n_min=5, n_max=6) == []


def test_batch_rows_are_independent() -> None:
    seqs = [[1, 2, 1], [2, 1], [5, 5, 5], [], [1, 2, 3, 1, 2]]
    proposer = NgramProposer(2)
    drafts = proposer.propose(seqs, [2, 2, 1, 2, 0])
    assert drafts == [[2, 1], [], [5], [], []]
    assert [proposer.propose([s], [m])[0] for s, m in zip(seqs, [2, 2, 1, 2, 0])] == drafts


def test_numpy_input() -> None:
    seqs = [np.array([1, 2, 9, 1, 2], dtype=np.int32), np.array([4, 4])]
    assert NgramProposer(3).propose(seqs, [3, 3]) == [[9, 1, 2], [4]]


@pytest.mark.parametrize("kwargs,field", [
    (dict(num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(num_speculative_tokens=2.0), "num_speculative_tokens"),
    (dict(num_speculative_tokens=True), "num_speculative_tokens"),
    (dict(num_speculative_tokens=2, prompt_lookup_min=0), "prompt_lookup_min"),
    (dict(num_speculative_tokens=2, prompt_lookup_max="4"), "prompt_lookup_max"),
    (dict(num_speculative_tokens=2, prompt_lookup_min=3, prompt_lookup_max=2), "prompt_lookup_max"),
])
def test_constructor_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        NgramProposer(**kwargs)


def test_propose_validation() -> None:
    with pytest.raises(ValueError, match="max_drafts"):
        NgramProposer(2).propose([[1, 2]], [1, 1])
    with pytest.raises(ValueError, match="max_drafts"):
        NgramProposer(2).propose([[1, 2]], [-1])


@pytest.mark.parametrize("seed", range(5))
def test_matches_brute_force_reference(seed: int) -> None:
    """Drafts and match lengths, 1 to 12 requests (up to FEW_REQUESTS each is searched alone, beyond in one batch)."""
    rng = random.Random(seed)
    for _ in range(20):
        k, n_min = rng.randint(1, 6), rng.randint(1, 3)
        n_max = rng.randint(n_min, 5)
        vocab = rng.choice([2, 3, 5, 20])
        seqs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 60))] for _ in range(rng.randint(1, 12))]
        max_drafts = [rng.randint(0, 7) for _ in seqs]
        proposer = NgramProposer(k, n_min, n_max)
        want = [reference(s, k, n_min, n_max, m) for s, m in zip(seqs, max_drafts)]
        assert proposer.propose(seqs, max_drafts) == [d for d, _ in want]
        assert proposer.propose_with_matches(seqs, max_drafts) == ([d for d, _ in want], [m for _, m in want])


def test_match_lengths_measure_past_prompt_lookup_max() -> None:
    tokens = [9, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 4, 5, 6]  # the suffix 1..6 matches 6 tokens back, n_max is 2
    drafts, matches = NgramProposer(3, 1, 2).propose_with_matches([tokens, [1, 2, 3]], [3, 3])
    assert drafts == [[8, 1, 2], []] and matches == [6, 0]


@pytest.mark.parametrize("seed", range(3))
def test_has_match_is_whether_propose_finds_drafts(seed: int) -> None:
    """has_match (one search of the shortest n, for the gate's look ahead) agrees with the brute-force reference's
    drafts on random sequences, matches and no matches alike."""
    rng = random.Random(seed)
    found = 0
    for _ in range(200):
        n_min = rng.randint(1, 3)
        n_max = rng.randint(n_min, 5)
        tokens = [rng.randrange(rng.choice([2, 5, 40, 300])) for _ in range(rng.randint(0, 40))]
        want = bool(reference(tokens, 3, n_min, n_max, 1)[0])
        assert NgramProposer(3, n_min, n_max).has_match(np.asarray(tokens, dtype=np.int64)) == want, tokens
        found += want
    assert 20 < found < 180  # both answers were asked about

"""N-gram proposer (prompt lookup, vLLM's "ngram" method): drafts copied from the request's own history.

For n from `prompt_lookup_max` down to `prompt_lookup_min`, look for the most recent EARLIER occurrence of
the sequence's last n tokens; the first n that has one wins, and the drafts are the tokens that followed
that occurrence. Example with n = 2 (a 3-gram [5 7 8] occurs nowhere earlier), k = 3:

    position   0  1  2  3  4  5  6  7  8  9
    token      4  7  8  9  3  7  8  5  7  8
                  └──┘        └──┘  │  └──┘ suffix: the last n tokens (never a match of itself)
                  older       most  └─────┘ drafts [5 7 8]: the tokens after the match
                  match       recent match

An occurrence must end before the last token (end <= L - 2), so at least one token follows it; the drafts
are the up to min(k, max_drafts[i]) tokens after it, cut at the end of the sequence (they may run into
the suffix itself, as above). Overlaps are fine: in [1 1 1 1] the 3-gram at 0..2 matches the suffix at
1..3 and drafts [1].

The search runs over the whole batch at once: the sequences are concatenated into one int64 array, every
earlier position holding its sequence's last token is a candidate end (one vectorised compare), and each
larger n keeps the candidates whose token n - 1 places back also matches. The cost is one pass over the
tokens plus work proportional to the candidates; converting Python lists to NumPy dominates (about 15 ns a
token), so callers that keep token ids in NumPy arrays pay nothing for it. Up to FEW_REQUESTS requests each is
searched alone instead (bytes.rfind of the suffix over the sequence's bytes: the same answer without numpy's fixed
cost of some twenty calls, which was most of a batch-1 decision on the H200's host).
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

__all__ = ["NgramProposer", "match_lengths", "most_recent_match_ends"]

MEASURE_UP_TO = 8  # propose_with_matches measures a chosen match's length up to this many tokens
FEW_REQUESTS = 8  # up to this many requests each is searched alone (_propose_one): numpy's ~20 calls cost more


class NgramProposer:
    """Prompt-lookup drafts: at most `num_speculative_tokens` per request (see the module docstring).

    Invariants: 1 <= num_speculative_tokens; 1 <= prompt_lookup_min <= prompt_lookup_max.
    """

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4) -> None:
        _check_positive_int(num_speculative_tokens, "num_speculative_tokens")
        _check_positive_int(prompt_lookup_min, "prompt_lookup_min")
        _check_positive_int(prompt_lookup_max, "prompt_lookup_max")
        if prompt_lookup_max < prompt_lookup_min:
            raise ValueError(f"prompt_lookup_max must be >= prompt_lookup_min ({prompt_lookup_min}), "
                             f"got {prompt_lookup_max}")
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, token_ids: list[Sequence[int]], max_drafts: list[int]) -> list[list[int]]:
        """Request i's drafts: at most min(num_speculative_tokens, max_drafts[i]) tokens, [] without a match."""
        return self.propose_with_matches(token_ids, max_drafts)[0]

    def propose_with_matches(self, token_ids: list[Sequence[int]], max_drafts: list[int]
                             ) -> tuple[list[list[int]], list[int]]:
        """`propose`, and for each request the length of the match its drafts continue (the tokens before the
        suffix's end that equal those before the match's end, up to MEASURE_UP_TO; 0 without drafts): how
        likely the drafts are to be accepted (lamina/engine/match_acceptance.py)."""
        if len(max_drafts) != len(token_ids):
            raise ValueError(f"max_drafts must have one entry per request ({len(token_ids)}), got {len(max_drafts)}")
        if any(not isinstance(m, (int, np.integer)) or m < 0 for m in max_drafts):
            raise ValueError(f"max_drafts must be integers >= 0, got {list(max_drafts)}")
        limits = [min(self.num_speculative_tokens, int(m)) for m in max_drafts]
        # a match needs n >= prompt_lookup_min tokens before the suffix's last token
        active = [i for i, seq in enumerate(token_ids) if limits[i] > 0 and len(seq) > self.prompt_lookup_min]
        drafts: list[list[int]] = [[] for _ in token_ids]
        matches = [0] * len(token_ids)
        if not active:
            return drafts, matches
        if len(active) <= FEW_REQUESTS:
            for i in active:
                drafts[i], matches[i] = self._propose_one(np.asarray(token_ids[i], dtype=np.int64), limits[i])
            return drafts, matches
        seqs = [token_ids[i] for i in active]
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        starts = np.cumsum(lengths) - lengths
        flat = _concatenate(seqs, int(lengths.sum()))
        ends = most_recent_match_ends(flat, starts, lengths, self.prompt_lookup_min, self.prompt_lookup_max)
        found = match_lengths(flat, starts, lengths, ends, MEASURE_UP_TO)
        for row in np.flatnonzero(ends >= 0).tolist():
            end, stop = int(ends[row]), int(starts[row] + lengths[row])
            drafts[active[row]] = flat[end + 1:min(end + 1 + limits[active[row]], stop)].tolist()
            matches[active[row]] = int(found[row])
        return drafts, matches

    def has_match(self, seq: np.ndarray) -> bool:
        """Whether `propose` finds drafts for the int64 sequence `seq` (given room for one): its last
        prompt_lookup_min tokens occur earlier, ending before its last token, as every longer match's do. One byte
        search, where `propose` measures the match it finds too."""
        length = len(seq)
        return length > self.prompt_lookup_min and _most_recent_end(seq.tobytes(), length,
                                                                     self.prompt_lookup_min) >= 0

    def _propose_one(self, seq: np.ndarray, limit: int) -> tuple[list[int], int]:
        """One request's (drafts, match length): the same search as the batched one, as byte searches over the
        sequence's int64 bytes (_most_recent_end), from the longest n down."""
        data, length = seq.tobytes(), len(seq)
        for n in range(min(self.prompt_lookup_max, length - 1), self.prompt_lookup_min - 1, -1):
            end = _most_recent_end(data, length, n)
            if end >= 0:
                return seq[end + 1:min(end + 1 + limit, length)].tolist(), _match_length(seq, end, MEASURE_UP_TO)
        return [], 0


def _most_recent_end(data: bytes, length: int, n: int) -> int:
    """Where the most recent occurrence of the last n of the `length` int64 tokens in `data` ends, before the last
    token (-1: nowhere): rfind over the bytes, a hit not on a token boundary searched past."""
    suffix = data[(length - n) * 8:]
    pos = data.rfind(suffix, 0, (length - 1) * 8)  # the occurrence ends before the last token
    while pos > 0 and pos % 8:
        pos = data.rfind(suffix, 0, pos + len(suffix) - 1)
    return pos // 8 + n - 1 if pos >= 0 and pos % 8 == 0 else -1


def _match_length(seq: np.ndarray, end: int, up_to: int) -> int:
    """How many tokens, counting back from seq[end] and from seq's last token, are equal (at most `up_to`)."""
    last, m = len(seq) - 1, 0
    while m < up_to and end - m >= 0 and seq[end - m] == seq[last - m]:
        m += 1
    return m


def most_recent_match_ends(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, n_min: int,
                           n_max: int) -> np.ndarray:
    """[S] int64: for segment s = flat[starts[s]:starts[s] + lengths[s]] (lengths >= 1), the flat index where
    the most recent earlier occurrence of its last n tokens ends, for the largest n in [n_min, n_max] that
    has one (ends before the segment's last token); -1 where no n has one."""
    lasts = starts + lengths - 1
    ends = np.flatnonzero(flat == np.repeat(flat[lasts], lengths))  # n = 1: sorted by (segment, position)
    segs = np.searchsorted(starts, ends, side="right") - 1
    keep = ends != lasts[segs]
    ends, segs = ends[keep], segs[keep]
    best = np.full(len(starts), -1, dtype=np.int64)
    for n in range(1, n_max + 1):
        if n > 1:  # the token n - 1 places back must match too, inside the same segment
            back = ends - (n - 1)
            suffix_back = np.maximum(lasts[segs] - (n - 1), 0)
            keep = (back >= starts[segs]) & (flat[np.maximum(back, 0)] == flat[suffix_back])
            ends, segs = ends[keep], segs[keep]
        if ends.size == 0:
            break
        if n >= n_min:  # a longer n overwrites: the longest match wins, then the most recent one
            is_last = np.append(segs[1:] != segs[:-1], True)
            best[segs[is_last]] = ends[is_last]
    return best


def match_lengths(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, ends: np.ndarray,
                  up_to: int) -> np.ndarray:
    """[S] int64: how many tokens, counting back from flat[ends[s]] and from segment s's last token, are equal
    (inside the segment, at most `up_to`; 0 where ends[s] < 0)."""
    out = np.zeros(len(ends), dtype=np.int64)
    rows = np.flatnonzero(ends >= 0)
    lasts = starts + lengths - 1
    for j in range(up_to):
        back = ends[rows] - j
        keep = (back >= starts[rows]) & (flat[np.maximum(back, 0)] == flat[lasts[rows] - j])
        rows = rows[keep]
        if rows.size == 0:
            break
        out[rows] += 1
    return out


def _concatenate(seqs: list[Sequence[int]], total: int) -> np.ndarray:
    if all(isinstance(s, np.ndarray) for s in seqs):
        return np.concatenate(seqs).astype(np.int64, copy=False)
    return np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=total)


def _check_positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

"""SamplingMetadata: the per-step batched tensors the Sampler needs, built from the rows' SamplingParams.

Row i of every tensor belongs to params[i] (the order of the logits rows). Optional pieces are None
when no row needs them, so the Sampler skips that work entirely:

    temperature  [B] float32   1.0 on greedy rows (a safe divisor; greedy rows take the argmax) | None
                               when every row is greedy
    greedy_mask  [B] bool      only in mixed batches (neither all_greedy nor all_random)
    top_k        [B] int64     vocab_size where off, 1 on greedy rows | None when no random row uses it
    top_p        [B] float32   1.0 where off               | None when no random row uses top-p
    min_p        [B] float32   0.0 where off               | None when no random row uses min-p
    penalties    PenaltyTensors                            | None when no row has a penalty
    min_tokens   MinTokensMask (row, token id) pairs       | None when no row is below min_tokens
    seeds        [B] int64 Philox key of each row's draw   | None: the kernel path is off (torch path)

Every tensor reaches the device by a non-blocking copy from pinned memory: building the metadata never
makes the host wait for the device (a plain torch.tensor(..., device="cuda") would wait for every
step queued before it, which undoes async scheduling).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lamina.sampling_params import SamplingParams


@dataclass
class PenaltyTensors:
    """Repetition / frequency / presence penalties of one step (neutral values on rows without them).

    prompt_token_mask is None when no row has a repetition penalty (only it looks at the prompt).
    """

    repetition_penalties: torch.Tensor  # [B] float32, 1.0 = off
    frequency_penalties: torch.Tensor  # [B] float32, 0.0 = off
    presence_penalties: torch.Tensor  # [B] float32, 0.0 = off
    output_token_counts: torch.Tensor  # [B, V] float32: occurrences of each token in the output so far
    prompt_token_mask: torch.Tensor | None  # [B, V] bool: token occurs in the prompt


@dataclass
class MinTokensMask:
    """Logits to set to -inf: logits[rows[j], token_ids[j]] (EOS and stop ids below min_tokens)."""

    rows: torch.Tensor  # [M] int64
    token_ids: torch.Tensor  # [M] int64


@dataclass
class SamplingMetadata:
    """Everything the Sampler needs for one step, batched (see the module docstring for the layout)."""

    temperature: torch.Tensor | None  # None when all_greedy
    all_greedy: bool
    all_random: bool
    greedy_mask: torch.Tensor | None
    top_k: torch.Tensor | None
    max_top_k: int  # the largest top_k below V (a Python int, so the sampler never syncs to read it)
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    generators: dict[int, torch.Generator]  # row -> the request's own generator (seeded rows only)
    max_num_logprobs: int | None  # None: no row asked for logprobs
    penalties: PenaltyTensors | None
    min_tokens: MinTokensMask | None
    seeds: torch.Tensor | None = None

    @property
    def no_penalties(self) -> bool:
        return self.penalties is None

    @classmethod
    def build(cls, params: list[SamplingParams], vocab_size: int, device: torch.device, *,
              generators: dict[int, torch.Generator] | None = None, seeds: list[int] | None = None,
              penalties: PenaltyTensors | None = None, min_tokens: MinTokensMask | None = None) -> SamplingMetadata:
        """The step's metadata, row i from params[i]. `generators`: row -> the generator of a seeded random
        row (the torch path); `seeds`: the rows' Philox keys for the sampling kernel (lamina.layers.sampler),
        given instead of generators; `penalties` and `min_tokens` as built by their owners."""
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        greedy = [p.greedy for p in params]
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        if all(greedy):  # the common decode of greedy requests: an argmax needs nothing else
            return cls(temperature=None, all_greedy=True, all_random=False, greedy_mask=None, top_k=None, max_top_k=1,
                       top_p=None, min_p=None, generators={}, max_num_logprobs=max(logprobs, default=None),
                       penalties=penalties, min_tokens=min_tokens)
        random_params = [p for p, g in zip(params, greedy) if not g]
        top_k = [_top_k(p, g, vocab_size) for p, g in zip(params, greedy)]
        generators = generators or {}
        missing = [i for i, (p, g) in enumerate(zip(params, greedy)) if not g and p.seed is not None
                   and i not in generators]
        if seeds is None and missing:
            raise ValueError(f"generators: seeded random rows {missing} have no generator (the runner creates "
                             "one per seeded request)")
        return cls(
            temperature=_floats([1.0 if g else p.temperature for p, g in zip(params, greedy)], device),
            all_greedy=False,
            all_random=not any(greedy),
            greedy_mask=host_to_device(greedy, torch.bool, device) if any(greedy) else None,
            top_k=(host_to_device(top_k, torch.int64, device)
                   if any(0 < p.top_k < vocab_size for p in random_params) else None),
            max_top_k=max((k for k in top_k if k < vocab_size), default=1),
            top_p=(_floats([1.0 if g else p.top_p for p, g in zip(params, greedy)], device)
                   if any(p.top_p < 1.0 for p in random_params) else None),
            min_p=(_floats([0.0 if g else p.min_p for p, g in zip(params, greedy)], device)
                   if any(p.min_p > 0.0 for p in random_params) else None),
            generators={} if seeds is not None else {i: g for i, g in generators.items() if not greedy[i]},
            max_num_logprobs=max(logprobs, default=None),
            penalties=penalties,
            min_tokens=min_tokens,
            seeds=None if seeds is None else host_to_device(seeds, torch.int64, device),
        )


def host_to_device(values: list | torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host values on `device` without making the host wait (pinned memory, non-blocking copy)."""
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _floats(values: list[float], device: torch.device) -> torch.Tensor:
    return host_to_device(values, torch.float32, device)


def _top_k(params: SamplingParams, greedy: bool, vocab_size: int) -> int:
    """top_k as a row value: 0 / -1 (off) and k > V mean "keep the whole vocabulary".

    Greedy rows get 1: their random sample is discarded, and 1 keeps `max_top_k` small.
    """
    if greedy:
        return 1
    if params.top_k <= 0:
        return vocab_size
    return min(params.top_k, vocab_size)


def penalty_tensors(params: list[SamplingParams], prompts: list[list[int]], outputs: list[list[int]],
                    vocab_size: int, device: torch.device) -> PenaltyTensors | None:
    """Penalty tensors rebuilt from token lists (the oracle of the worker's incremental PenaltyState)."""
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return None
    shape = (len(params), vocab_size)
    rep_rows = [i for i in rows if params[i].repetition_penalty != 1.0]
    prompt_mask = None
    if rep_rows:
        prompt_mask = _token_counts([prompts[i] for i in rep_rows], rep_rows, shape, device) > 0
    return PenaltyTensors(
        repetition_penalties=_floats([p.repetition_penalty for p in params], device),
        frequency_penalties=_floats([p.frequency_penalty for p in params], device),
        presence_penalties=_floats([p.presence_penalty for p in params], device),
        output_token_counts=_token_counts([outputs[i] for i in rows], rows, shape, device),
        prompt_token_mask=prompt_mask,
    )


def _token_counts(token_lists: list[list[int]], rows: list[int], shape: tuple[int, int],
                  device: torch.device) -> torch.Tensor:
    """[B, V] float32 counts: counts[rows[j], t] = occurrences of t in token_lists[j] (one scatter_add)."""
    vocab_size = shape[1]
    ids = torch.tensor([t for tokens in token_lists for t in tokens], dtype=torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"token ids must be in [0, {vocab_size}) for penalties, got "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    lengths = torch.tensor([len(tokens) for tokens in token_lists], dtype=torch.int64)
    flat = torch.repeat_interleave(torch.tensor(rows, dtype=torch.int64), lengths) * vocab_size + ids
    counts = torch.zeros(shape[0] * vocab_size, dtype=torch.float32, device=device)
    flat = host_to_device(flat, torch.int64, device)
    counts.scatter_add_(0, flat, torch.ones(flat.shape, dtype=torch.float32, device=device))
    return counts.view(shape)


def min_tokens_mask(params: list[SamplingParams], num_output_tokens: list[int], eos_token_ids: list[frozenset[int]],
                    vocab_size: int, device: torch.device) -> MinTokensMask | None:
    """EOS and stop ids of the rows still below their min_tokens; None when no row is."""
    rows: list[int] = []
    token_ids: list[int] = []
    for i, (p, num_out, eos) in enumerate(zip(params, num_output_tokens, eos_token_ids)):
        if num_out >= p.min_tokens:
            continue
        banned = set(p.stop_token_ids or ())
        if not p.ignore_eos:
            banned |= set(eos)
        # an id outside the vocabulary can never be sampled, so there is nothing to mask
        kept = sorted(t for t in banned if 0 <= t < vocab_size)
        rows.extend([i] * len(kept))
        token_ids.extend(kept)
    if not rows:
        return None
    return MinTokensMask(rows=host_to_device(rows, torch.int64, device),
                         token_ids=host_to_device(token_ids, torch.int64, device))


_MASK64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 arrays (wrapping arithmetic): a bijection of 64-bit ints that scatters
    nearby inputs."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def seeded_keys(seeds: Sequence[int], sample_positions: Sequence[int] | np.ndarray) -> np.ndarray:
    """[n] int64: the key of a row of seed seeds[i] that samples the token at index sample_positions[i] of its
    request: a function of the two alone (any integer is a seed: its low 64 bits count)."""
    seeds = np.fromiter((s & _MASK64 for s in seeds), dtype=np.uint64, count=len(seeds))
    return (_mix64(_mix64(seeds) ^ np.asarray(sample_positions, dtype=np.int64).astype(np.uint64))).view(np.int64)


def _mix64_int(x: int) -> int:
    """_mix64 of one Python int in [0, 2**64): the same bits, without numpy's fixed cost of a few microseconds an
    operation (philox_keys runs every sampling step)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _seeded_key_int(seed: int, sample_position: int) -> int:
    """seeded_keys of one row, as an int in [0, 2**64)."""
    return _mix64_int(_mix64_int(seed & _MASK64) ^ (sample_position & _MASK64))


FEW_SEEDED_ROWS = 8  # up to this many seeded rows, philox_keys mixes Python ints (numpy's calls cost more)


def philox_keys(seeds: list[int | None], sample_positions: list[int], step_key: int) -> list[int]:
    """The sampling kernel's key of each row, as int64. A seeded row's key depends only on its seed and
    the index of the token it samples (seeded_keys), so its tokens do not depend on the batch, on async
    scheduling or on preemption; the others take step_key + row (step_key fresh every step)."""
    keys = [(step_key + row) & _MASK64 for row in range(len(seeds))]
    seeded = [row for row, seed in enumerate(seeds) if seed is not None]
    if len(seeded) <= FEW_SEEDED_ROWS:
        for row in seeded:
            keys[row] = _seeded_key_int(seeds[row], sample_positions[row])
    else:
        for row, key in zip(seeded, seeded_keys([seeds[r] for r in seeded],
                                                [sample_positions[r] for r in seeded])):
            keys[row] = int(key) & _MASK64
    return [key - (1 << 64) if key >= 1 << 63 else key for key in keys]

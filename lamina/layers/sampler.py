"""Sampler: logits [B, V] -> one token per row, plus logprobs of the raw model distribution.

Order of processing (vLLM's):

    raw logits ──> logprobs (log_softmax of the RAW logits, when any row asked)
        │
        ├─ min_tokens mask (EOS / stop ids -> -inf)
        ├─ repetition penalty (prompt + output tokens), frequency & presence penalties (output tokens)
        ├─ greedy rows: argmax                     (all greedy: nothing else runs, no softmax; CUDA: a
        │                                            two-pass Triton argmax, lamina/kernels/argmax.py, or
        │                                            the one a CUDA graph computed with the logits)
        └─ random rows: / temperature -> top-k -> top-p -> min-p -> exponential race

The exponential race picks argmax(p_i / q_i) with q_i ~ Exp(1), which samples i with probability p_i.
A seeded row draws its q from its own generator, so its tokens do not depend on the rest of the batch.
The sets kept (ties always stay together; the top token always stays):

    top-k   l_j >= the k-th largest logit
    top-p   the mass of the tokens strictly more likely than j (after top-k) is below p
    min-p   p_j >= min_p * max p

When the model runner keys the rows for it (`SamplingMetadata.seeds`: CUDA with triton,
`uses_sampling_kernel`), one Triton kernel samples these same sets without sorting
(lamina/kernels/sampling.py); the torch functions here are its oracle.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from lamina.layers.dispatch import kernel_module
from lamina.layers.sampling_metadata import MinTokensMask, PenaltyTensors, SamplingMetadata
from lamina.outputs import Logprob

__all__ = ["LogprobsTensors", "Sampler", "SamplerOutput", "SamplingMetadata", "logprob_dict",
           "to_logprob_dicts"]


@dataclass
class LogprobsTensors:
    """Logprobs of the raw model distribution; N = the largest `logprobs` requested in the batch."""

    top_ids: torch.Tensor  # [B, N] int64, most likely first
    top_logprobs: torch.Tensor  # [B, N] float32
    sampled_logprob: torch.Tensor  # [B] float32
    sampled_rank: torch.Tensor  # [B] int64, 1 = the most likely token


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None  # None when no row asked for logprobs


class Sampler(nn.Module):
    """Batched sampling of one token per row (see the module docstring for the order of operations).

    `generator` is the shared generator of the rows without a seed (None: torch's default RNG);
    it must live on the logits' device.
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata,
                argmax: torch.Tensor | None = None) -> SamplerOutput:
        """Sample from `logits` [B, V] float32 (not modified) under `metadata`. `argmax` [B]: each row's argmax of
        `logits`, computed already (inside a CUDA graph, lamina/worker/cuda_graphs.py): the tokens of a step whose
        rows are all greedy and whose logits nothing edits first (no min_tokens, no penalties), with no launch."""
        processed = process_logits(logits, metadata)
        if argmax is not None and metadata.all_greedy and processed is logits:
            sampled = argmax.clone()  # the tokens outlive the graph's buffer (the next replay rewrites it)
        else:
            sampled = self._sample(processed, metadata)
        logprobs = None
        if metadata.max_num_logprobs is not None:
            # every step above is out of place, so `logits` are still the raw model output
            logprobs = compute_logprobs(logits, sampled, metadata.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def _sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        if metadata.all_greedy:
            return greedy_tokens(logits)
        if metadata.seeds is not None:  # the caller chose the kernel (uses_sampling_kernel) and keyed the rows
            return sample_with_kernel(_load_sampling_kernels(), logits, metadata)
        probs = random_probs(logits, metadata)
        random = exponential_race(probs, metadata.generators, self.generator)
        if metadata.all_random:
            return random
        return torch.where(metadata.greedy_mask, greedy_tokens(logits), random)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax (its first largest logit): on CUDA the two-pass Triton kernel (lamina.kernels.argmax: torch's
    reduces a row in one block, 27 us at a 128k vocabulary on the H200), else torch.argmax."""
    kernel = _load_argmax_kernel() if logits.is_cuda and logits.stride(-1) == 1 else None
    return logits.argmax(dim=-1) if kernel is None else kernel.argmax(logits)


def _load_sampling_kernels() -> ModuleType | None:
    return kernel_module("sampling")  # None without triton: the torch path


def _load_argmax_kernel() -> ModuleType | None:
    return kernel_module("argmax")  # None without triton: torch.argmax


def uses_sampling_kernel(device: torch.device) -> bool:
    """Whether random rows on `device` go to the Triton kernel: CUDA, and triton imports (tried once)."""
    return device.type == "cuda" and _load_sampling_kernels() is not None


def sample_with_kernel(kernels: ModuleType, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """Every row in one sorting-free kernel launch; greedy rows get temperature 0 (argmax)."""
    assert metadata.temperature is not None and metadata.seeds is not None
    temperature = metadata.temperature
    if metadata.greedy_mask is not None:
        temperature = temperature.masked_fill(metadata.greedy_mask, 0.0)
    kth = None if metadata.top_k is None else kth_largest(logits, metadata.top_k, metadata.max_top_k)
    return kernels.sample(logits, temperature, metadata.seeds, top_p=metadata.top_p, min_p=metadata.min_p,
                          kth=kth)


def process_logits(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """min_tokens mask and penalties; returns a new tensor when anything applies (input untouched)."""
    if metadata.min_tokens is not None:
        logits = apply_min_tokens_mask(logits, metadata.min_tokens)
    if metadata.penalties is not None:
        logits = apply_penalties(logits, metadata.penalties)
    return logits


def apply_min_tokens_mask(logits: torch.Tensor, mask: MinTokensMask) -> torch.Tensor:
    """Out of place: logits[rows[j], token_ids[j]] = -inf."""
    out = logits.clone()
    out[mask.rows, mask.token_ids] = float("-inf")
    return out


def apply_penalties(logits: torch.Tensor, penalties: PenaltyTensors) -> torch.Tensor:
    """Out of place. Repetition (tokens seen in prompt or output): positive logits / r, others * r.
    Then OpenAI's: logits -= frequency * count + presence * (count > 0), counts over the output."""
    counts = penalties.output_token_counts
    seen = counts > 0
    if penalties.prompt_token_mask is not None:
        rep = penalties.repetition_penalties.unsqueeze(1).expand_as(logits)
        rep = torch.where(seen | penalties.prompt_token_mask, rep, torch.ones_like(rep))
        logits = torch.where(logits > 0, logits / rep, logits * rep)
    freq = penalties.frequency_penalties.unsqueeze(1)
    presence = penalties.presence_penalties.unsqueeze(1)
    return logits - (freq * counts + presence * seen.to(logits.dtype))


def random_probs(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p; returns probabilities, unnormalised after min-p (the race
    does not need them normalised). Greedy rows get garbage that the caller discards."""
    assert metadata.temperature is not None, "random rows need temperatures"
    logits = logits / metadata.temperature.unsqueeze(1)
    logits = apply_top_k_top_p(logits, metadata.top_k, metadata.max_top_k, metadata.top_p)
    probs = logits.softmax(dim=-1)
    if metadata.min_p is not None:
        probs = apply_min_p(probs, metadata.min_p)
    return probs


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, max_top_k: int,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask (-inf) the tokens outside top-k, then outside top-p of what is left (module docstring)."""
    if top_k is not None:
        logits = logits.masked_fill(logits < kth_largest(logits, top_k, max_top_k).unsqueeze(1), float("-inf"))
    if top_p is not None:
        logits = logits.masked_fill(logits < top_p_threshold(logits, top_p).unsqueeze(1), float("-inf"))
    return logits


def kth_largest(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """[B]: each row's top_k-th largest logit, -inf where top_k >= V (off); one topk(max_top_k), no sort."""
    vocab_size = logits.shape[1]
    width = max(1, min(max_top_k, vocab_size))
    values = logits.topk(width, dim=-1).values
    kth = values.gather(1, (top_k.clamp(max=width) - 1).unsqueeze(1)).squeeze(1)
    return kth.masked_fill(top_k >= vocab_size, float("-inf"))


def top_p_threshold(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B]: the smallest logit of each row's top-p set, where token j stays iff the mass of the tokens
    before it in descending order is below p (its tie group stays whole: the mask is logits < this)."""
    descending = logits.sort(dim=-1, descending=True).values
    probs = descending.softmax(dim=-1)
    kept = (probs.cumsum(dim=-1) - probs) < top_p.unsqueeze(1)  # a prefix, at least the top token
    return descending.gather(1, (kept.sum(dim=-1, keepdim=True) - 1)).squeeze(1)


def apply_min_p(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Zero the tokens whose probability is below min_p * (the row's top probability)."""
    threshold = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return probs.masked_fill(probs < threshold, 0.0)


def exponential_race(probs: torch.Tensor, generators: dict[int, torch.Generator],
                     default: torch.Generator | None) -> torch.Tensor:
    """argmax(probs / q), q ~ Exp(1): row i's q comes from generators[i] if present, else `default`."""
    q = exponential_noise(probs, generators, default)
    # q == 0 (possible in float32) would turn 0 / 0 into NaN, which argmax would pick
    q.clamp_(min=torch.finfo(q.dtype).tiny)
    return (probs / q).argmax(dim=-1)


def exponential_noise(like: torch.Tensor, generators: dict[int, torch.Generator],
                      default: torch.Generator | None) -> torch.Tensor:
    """Exp(1) draws of `like`'s shape, dtype and device as -log(1 - U), U ~ U[0, 1): row i's uniforms from
    generators[i] if present, else from `default`: one uniform fill per generator, then one vectorised transform.
    The law of Tensor.exponential_ in about a quarter of its time on the CPU (docs/BENCHMARKS.md, twenty-second
    session)."""
    u = torch.empty_like(like)
    if len(generators) < like.shape[0]:
        torch.rand(u.shape, generator=default, out=u)
    for row, gen in generators.items():
        torch.rand(u.shape[1:], generator=gen, out=u[row])
    return u.neg_().log1p_().neg_()


def compute_logprobs(logits: torch.Tensor, sampled: torch.Tensor, num_logprobs: int) -> LogprobsTensors:
    """Top-`num_logprobs` of log_softmax(logits) and the sampled token's logprob and rank."""
    logprobs = logits.float().log_softmax(dim=-1)
    top_logprobs, top_ids = logprobs.topk(num_logprobs, dim=-1)
    chosen = logprobs.gather(1, sampled.unsqueeze(1))
    return LogprobsTensors(top_ids=top_ids, top_logprobs=top_logprobs,
                           sampled_logprob=chosen.squeeze(1),
                           sampled_rank=(logprobs > chosen).sum(dim=-1) + 1)


def to_logprob_dicts(logprobs: LogprobsTensors, sampled_token_ids: torch.Tensor | Sequence[int],
                     num_logprobs: Sequence[int | None]) -> list[dict[int, Logprob] | None]:
    """One dict per row (None where the row asked for no logprobs): the sampled token first, then the
    row's own top-`num_logprobs[i]` tokens in rank order. One device->host copy per tensor."""
    sampled = (sampled_token_ids.tolist() if isinstance(sampled_token_ids, torch.Tensor)
               else list(sampled_token_ids))
    top_ids, top_lps = logprobs.top_ids.tolist(), logprobs.top_logprobs.tolist()
    sampled_lps, ranks = logprobs.sampled_logprob.tolist(), logprobs.sampled_rank.tolist()
    return [None if n is None else
            logprob_dict(sampled[i], sampled_lps[i], ranks[i], top_ids[i][:n], top_lps[i][:n])
            for i, n in enumerate(num_logprobs)]


def logprob_dict(sampled_id: int, sampled_logprob: float, sampled_rank: int, top_ids: Sequence[int],
                 top_logprobs: Sequence[float]) -> dict[int, Logprob]:
    """{token id: Logprob} for one row: the sampled token plus the top tokens (rank = position + 1)."""
    out = {sampled_id: Logprob(logprob=sampled_logprob, rank=sampled_rank)}
    for position, (token_id, logprob) in enumerate(zip(top_ids, top_logprobs)):
        out.setdefault(token_id, Logprob(logprob=logprob, rank=position + 1))
    return out

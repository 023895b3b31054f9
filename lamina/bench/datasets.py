"""Synthetic request sets for `lamina bench serve`: vLLM's `random` dataset and BENCHMARKS.md's W1.

Prompts are token-id lists by default: the OpenAI completions API accepts a list of ints as `prompt`
(vLLM, SGLang and lamina take it), so the prompt length is exact and no tokenizer is needed on the
client. `prompt_format="text"` turns each id into a common English word instead, for servers that take
only text; most BPE tokenizers spend about one token per such word, so lengths are then approximate
(the server's `usage.prompt_tokens` is what the benchmark counts when it is reported).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

DATASETS = ("random", "w1")
PROMPT_FORMATS = ("ids", "text")
DEFAULT_NUM_PROMPTS = {"random": 1000, "w1": 256}
DEFAULT_VOCAB_SIZE = 10000  # random token ids when the server does not report its vocab_size

# W1 ("nano-vllm workload"): lengths uniform in [100, 1024] for prompt and output, ids drawn with
# Python's `random.randint(0, 10000)` (inclusive, as nano-vllm's bench.py does; this exact stream gives
# BENCHMARKS.md's 133,966 output tokens for seed 0 and 256 prompts).
W1_LEN_RANGE = (100, 1024)
W1_MAX_TOKEN_ID = 10000

_WORDS = (
    "the of and to in is it you that he was for on are with as his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she which do "
    "their time if will way about many then them write would like so these her long make thing see him two "
    "has look more day could go come did number sound no most people my over know water than call first who "
    "may down side been now find any new work part take get place made live where after back little only "
    "round man year came show every good me give our under name very through just form sentence great think"
).split()


@dataclass(frozen=True)
class SampleRequest:
    """One request to send: the prompt (token ids or text), its length in tokens and the output budget."""

    prompt: list[int] | str
    prompt_len: int
    expected_output_len: int


@dataclass(frozen=True)
class DatasetConfig:
    """Which requests to generate. `input_len`, `output_len`, `range_ratio`, `vocab_size` apply to `random`.

    random: lengths uniform in [floor(L * (1 - r)), ceil(L * (1 + r))] (vLLM's `--random-range-ratio`),
    token ids uniform in [0, vocab_size), numpy's PCG64 seeded with `seed` (`lamina bench serve` sets
    vocab_size to the served model's when the server reports it).
    w1: BENCHMARKS.md's W1 distribution with Python's `random` seeded with `seed`.
    """

    name: str = "random"
    num_prompts: int = 1000
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    vocab_size: int = DEFAULT_VOCAB_SIZE
    prompt_format: str = "ids"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in DATASETS:
            raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}, got {self.name!r}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"--prompt-format must be one of {', '.join(PROMPT_FORMATS)}, got {self.prompt_format!r}")
        if self.num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        for option, value in (("--random-input-len", self.input_len), ("--random-output-len", self.output_len),
                              ("--random-vocab-size", self.vocab_size)):
            if value < 1:
                raise ValueError(f"{option} must be >= 1, got {value}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise ValueError(f"--random-range-ratio must be in [0, 1), got {self.range_ratio}")


def length_bounds(length: int, range_ratio: float) -> tuple[int, int]:
    """The inclusive [low, high] interval vLLM draws a length from (low is at least 1)."""
    low = int(np.floor(length * (1.0 - range_ratio)))
    high = int(np.ceil(length * (1.0 + range_ratio)))
    return max(low, 1), max(high, 1)


def random_requests(cfg: DatasetConfig) -> list[SampleRequest]:
    """vLLM's `random` dataset: uniform lengths around the means, uniform token ids."""
    rng = np.random.default_rng(cfg.seed)
    in_low, in_high = length_bounds(cfg.input_len, cfg.range_ratio)
    out_low, out_high = length_bounds(cfg.output_len, cfg.range_ratio)
    input_lens = rng.integers(in_low, in_high + 1, size=cfg.num_prompts)
    output_lens = rng.integers(out_low, out_high + 1, size=cfg.num_prompts)
    prompts = [rng.integers(0, cfg.vocab_size, size=int(n)).tolist() for n in input_lens]
    return [SampleRequest(p, len(p), int(o)) for p, o in zip(prompts, output_lens)]


def w1_requests(num_prompts: int, seed: int) -> list[SampleRequest]:
    """W1: prompts first, then output lengths, from one `random.Random(seed)` (nano-vllm's order)."""
    rng = random.Random(seed)
    low, high = W1_LEN_RANGE
    prompts = [[rng.randint(0, W1_MAX_TOKEN_ID) for _ in range(rng.randint(low, high))] for _ in range(num_prompts)]
    output_lens = [rng.randint(low, high) for _ in range(num_prompts)]
    return [SampleRequest(p, len(p), o) for p, o in zip(prompts, output_lens)]


def ids_to_text(token_ids: list[int]) -> str:
    """A text prompt of one common word per token id (deterministic in the ids)."""
    return " ".join(_WORDS[i % len(_WORDS)] for i in token_ids)


@dataclass(frozen=True)
class ServerLimits:
    """What the served model accepts, as GET /v1/models reports it (None: not reported)."""

    max_model_len: int | None = None  # prompt + output tokens
    vocab_size: int | None = None  # prompt token ids in [0, vocab_size)

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"the server's max_model_len is {self.max_model_len}: no room for a prompt and output")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"the server's vocab_size is {self.vocab_size}: must be >= 1")


@dataclass
class FitReport:
    """Requests fitted to a server, and how many had to change."""

    requests: list[SampleRequest]
    num_shortened: int = 0
    num_folded: int = 0

    def notes(self, limits: ServerLimits) -> list[str]:
        """One line per kind of change, for the user."""
        total, lines = len(self.requests), []
        if self.num_shortened:
            lines.append(f"{self.num_shortened} of {total} requests shortened to fit the server's max_model_len "
                         f"{limits.max_model_len} (prompt + output tokens)")
        if self.num_folded:
            lines.append(f"{self.num_folded} of {total} prompts had token ids >= the server's vocab_size "
                         f"{limits.vocab_size}: folded into range (id % vocab_size)")
        return lines


def fit_lengths(prompt_len: int, output_len: int, max_model_len: int) -> tuple[int, int]:
    """(prompt, output) lengths with prompt + output <= max_model_len; unchanged when they fit.

    Each side keeps at least min(its length, max_model_len // 2); the output keeps what it asked for
    within that, the prompt takes the rest (a 1024-token prompt with 128 output tokens in a 1024-token
    context becomes 896 + 128).
    """
    if prompt_len + output_len <= max_model_len:
        return prompt_len, output_len
    output = min(output_len, max_model_len - min(prompt_len, max_model_len // 2))
    return min(prompt_len, max_model_len - output), output


def fit_to_server(requests: list[SampleRequest], limits: ServerLimits) -> FitReport:
    """Token-id requests the server accepts: ids folded into its vocabulary, lengths into its context."""
    report = FitReport([])
    for request in requests:
        prompt, out_len = list(request.prompt), request.expected_output_len
        if limits.vocab_size is not None and any(t >= limits.vocab_size for t in prompt):
            prompt = [t % limits.vocab_size for t in prompt]
            report.num_folded += 1
        if limits.max_model_len is not None:
            prompt_len, out_len = fit_lengths(len(prompt), out_len, limits.max_model_len)
            if (prompt_len, out_len) != (len(prompt), request.expected_output_len):
                prompt = prompt[:prompt_len]
                report.num_shortened += 1
        report.requests.append(SampleRequest(prompt, len(prompt), out_len))
    return report


def as_prompt_format(requests: list[SampleRequest], prompt_format: str) -> list[SampleRequest]:
    """Token-id requests as `prompt_format` asks: unchanged for ids, one word per id for text."""
    if prompt_format == "text":
        return [SampleRequest(ids_to_text(r.prompt), r.prompt_len, r.expected_output_len) for r in requests]
    return requests


def sample_requests(cfg: DatasetConfig, limits: ServerLimits | None = None) -> list[SampleRequest]:
    """The requests `cfg` describes, fitted to `limits` when given, as token ids or as text."""
    requests = w1_requests(cfg.num_prompts, cfg.seed) if cfg.name == "w1" else random_requests(cfg)
    if limits is not None:
        requests = fit_to_server(requests, limits).requests
    return as_prompt_format(requests, cfg.prompt_format)

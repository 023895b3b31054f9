"""Turn what a user sent (a prompt and SamplingParams) into validated Requests.

Every error names the field and what is allowed; nothing is clamped or dropped silently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from lamina.engine.request import Request
from lamina.loader.tokenizer import Tokenizer
from lamina.sampling_params import SamplingParams, first_invalid_char, valid_text

# A prompt is a string, or vLLM's dict forms {"prompt": str} / {"prompt_token_ids": [int, ...]}.
PromptType = Union[str, dict]


@dataclass(frozen=True)
class InputLimits:
    vocab_size: int
    max_model_len: int
    max_logprobs: int


class InputProcessor:
    def __init__(self, tokenizer: Tokenizer | None, limits: InputLimits, eos_token_ids: frozenset[int]) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.eos_token_ids = eos_token_ids

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """Return (prompt text or None, prompt token ids), validated."""
        if isinstance(prompt, str):
            return prompt, self._encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                self._check_token_ids(ids)
                text = prompt.get("prompt")
                if text is not None:
                    _check_text(text)
                return text, list(ids)
            if isinstance(prompt.get("prompt"), str):
                return prompt["prompt"], self._encode(prompt["prompt"])
        raise ValueError("prompt: must be a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
                         f"got {type(prompt).__name__}")

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("prompt: text prompts need a tokenizer (skip_tokenizer_init=True was set); "
                             "pass {'prompt_token_ids': [...]} instead")
        _check_text(text)
        if not text:
            raise ValueError("prompt: must not be empty")
        return self.tokenizer.encode(text)

    def _check_token_ids(self, ids: object) -> None:
        if not isinstance(ids, (list, tuple)) or not ids:
            raise ValueError("prompt_token_ids: must be a non-empty list of integers")
        vocab = self.limits.vocab_size
        for i, token in enumerate(ids):
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab:
                raise ValueError(f"prompt_token_ids[{i}]: {token!r} is out of range; "
                                 f"token ids must be integers in [0, {vocab})")

    def check_params(self, params: SamplingParams, num_prompt_tokens: int) -> None:
        limits = self.limits
        if num_prompt_tokens >= limits.max_model_len:
            raise ValueError(f"prompt: {num_prompt_tokens} tokens leave no room for output; the prompt "
                             f"must be shorter than max_model_len ({limits.max_model_len})")
        if params.max_tokens is not None and num_prompt_tokens + params.max_tokens > limits.max_model_len:
            raise ValueError(
                f"max_tokens: this model's maximum context length is {limits.max_model_len} tokens "
                f"(max_model_len); the request asks for {num_prompt_tokens + params.max_tokens} "
                f"({num_prompt_tokens} in the prompt, {params.max_tokens} in the completion). Lower max_tokens "
                f"(at most {limits.max_model_len - num_prompt_tokens}) or set it to None (the rest of the context)")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > limits.max_logprobs:
                raise ValueError(f"{name}: {value} is above the limit of {limits.max_logprobs} (max_logprobs)")
        if params.stop_list and self.tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer (skip_tokenizer_init=True was set); "
                             "use stop_token_ids instead")
        bad = [t for t in params.stop_token_ids if t >= limits.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids: {bad} are out of range [0, {limits.vocab_size})")

    def make_requests(self, request_id: str, prompt: PromptType, params: SamplingParams,
                      arrival_time: float | None = None) -> list[Request]:
        """One Request per parallel sample; samples 1..n-1 share sample 0's prompt KV."""
        text, ids = self.tokenize(prompt)
        self.check_params(params, len(ids))
        requests: list[Request] = []
        for index in range(params.n):
            sample_params = params if params.n == 1 else params.clone_for_sample(index)
            sample_id = request_id if params.n == 1 else f"{index}_{request_id}"
            extra = {} if arrival_time is None else {"arrival_time": arrival_time}
            requests.append(Request(
                request_id=sample_id, prompt_token_ids=list(ids), sampling_params=sample_params,
                eos_token_ids=self.eos_token_ids, prompt=text,
                parent=requests[0] if requests else None, sample_index=index, **extra))
        return requests


def _check_text(text: object) -> None:
    """Prompt text the tokenizer can take: a str of valid Unicode (a lone surrogate makes it raise TypeError)."""
    if not isinstance(text, str):
        raise ValueError(f"prompt: must be a string, got {type(text).__name__}")
    if not valid_text(text):
        raise ValueError(f"prompt: must be valid Unicode text, got {first_invalid_char(text)}")

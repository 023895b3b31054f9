"""SamplingParams: how to pick each next token and when to stop (vLLM's names and defaults)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5


class RequestOutputKind(enum.Enum):
    """What each RequestOutput of a request carries (vLLM's kinds).

    CUMULATIVE: all text, token ids and logprobs so far, in every output (O(n) per output).
    DELTA: only what is new since the request's previous output, the final one included; streaming
        clients concatenate. Linear in the output length: what a server streams.
    FINAL_ONLY: one output, complete, when the request finishes (LLM.generate, non-streaming requests).
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def _check(ok: bool, name: str, allowed: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """Per-request sampling and stopping settings.

    temperature 0 means greedy (argmax); top_k 0 or -1 disables top-k; max_tokens None means
    "until the context (max_model_len) is full". Values are validated here, never clamped.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stop_list: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._validate_sampling()
        self._validate_stopping()
        self.stop_list = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])

    def _validate_sampling(self) -> None:
        _check(_is_int(self.n) and self.n >= 1, "n", "an integer >= 1", self.n)
        _check(_is_number(self.temperature) and self.temperature >= 0, "temperature", "a number >= 0",
               self.temperature)
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "a number in (0, 1]", self.top_p)
        _check(_is_int(self.top_k) and self.top_k >= -1, "top_k", "-1, 0 (disabled) or an integer >= 1",
               self.top_k)
        _check(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "a number in [0, 1]", self.min_p)
        _check(_is_number(self.repetition_penalty) and self.repetition_penalty > 0, "repetition_penalty",
               "a number > 0", self.repetition_penalty)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_number(value) and -2 <= value <= 2, name, "a number in [-2, 2]", value)
        _check(self.seed is None or _is_int(self.seed), "seed", "an integer or None", self.seed)
        _check(self.logprobs is None or (_is_int(self.logprobs) and self.logprobs >= 0), "logprobs",
               "an integer >= 0 or None", self.logprobs)
        _check(isinstance(self.output_kind, RequestOutputKind), "output_kind",
               "a RequestOutputKind (" + ", ".join(k.name for k in RequestOutputKind) + ")", self.output_kind)

    def _validate_stopping(self) -> None:
        _check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
               "max_tokens", "an integer >= 1 or None", self.max_tokens)
        _check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "an integer >= 0",
               self.min_tokens)
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens", f"<= max_tokens ({self.max_tokens})",
                   self.min_tokens)
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        _check(stops is None or (isinstance(stops, (list, tuple))
                                 and all(isinstance(s, str) and s for s in stops)),
               "stop", "a non-empty string or a list of non-empty strings", self.stop)
        ids = self.stop_token_ids
        _check(ids is None or (isinstance(ids, (list, tuple)) and all(_is_int(t) and t >= 0 for t in ids)),
               "stop_token_ids", "a list of integers >= 0", ids)

    @property
    def has_penalties(self) -> bool:
        """Repetition, frequency or presence penalty on (sampling then reads the tokens so far)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def clone_for_sample(self, index: int) -> SamplingParams:
        """Parameters of parallel sample `index` of an n > 1 request: n=1, seed offset by the index."""
        seed = None if self.seed is None else self.seed + index
        return SamplingParams(**{**self._init_fields(), "n": 1, "seed": seed})

    def with_output_kind(self, kind: RequestOutputKind) -> SamplingParams:
        """These parameters asking for `kind`: a copy unless they already do (a caller's object is never
        mutated: LLM.generate and the server pick the kind they need without touching the user's)."""
        if kind is self.output_kind:
            return self
        return SamplingParams(**{**self._init_fields(), "output_kind": kind})

    def _init_fields(self) -> dict:
        names = [f for f in self.__dataclass_fields__ if self.__dataclass_fields__[f].init]
        return {name: getattr(self, name) for name in names}

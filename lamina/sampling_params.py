"""SamplingParams: how to pick each next token and when to stop (vLLM's names and defaults).

Every field is checked here, once, for the Python API and the server alike (the server's request models
only fix JSON types and hand the values to SamplingParams). The bounds:

    n                       integer in [1, 1024]
    temperature             finite number in [0, 100]         (0: greedy)
    top_p                   number in (0, 1]
    top_k                   -1 or 0 (disabled), or an integer in [1, 2^31 - 1]  (>= vocab_size: all tokens)
    min_p                   number in [0, 1]
    repetition_penalty      number in [0.01, 100]              (1: off)
    presence_penalty,
    frequency_penalty       number in [-2, 2]
    seed                    None or an integer in [-2^63, 2^63 - 1] (int64, as vLLM; sample i of n uses seed + i,
                            wrapped into the same range)
    max_tokens              None (the rest of the context) or an integer in [1, 2^31 - 1]; the engine also refuses
                            prompt tokens + max_tokens > max_model_len (never clamped)
    min_tokens              integer in [0, max_tokens]
    logprobs                None or an integer >= 0 (the engine's max_logprobs caps it)
    prompt_logprobs         None or an integer >= 0: the logprob of every prompt token after the first, plus the
                            top-N at each position (the engine's max_logprobs caps it; such a request skips the
                            prefix cache: its prompt is computed to be scored)
    stop                    a non-empty string or a list of at most 64 of them, valid Unicode
    stop_token_ids          a list of at most 1024 integers in [0, 2^31 - 1] (the engine checks < vocab_size)
    the flags               bool

Booleans are not numbers here (True is no temperature), and NaN fails every range.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5
MAX_N = 1024
MAX_TEMPERATURE = 100.0
MAX_INT32 = 2**31 - 1
REPETITION_PENALTY_RANGE = (0.01, 100.0)
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024


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
        raise ValueError(f"{name} must be {allowed}, got {_show(value)}")


def _show(value: object) -> str:
    """A short repr: a huge integer (whose repr may itself fail past 4300 digits) or a long list is summarised."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    text = ascii(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _in_range(value: object, low: float, high: float, *, integer: bool = False) -> bool:
    """`value` is a number (an int when `integer`; never a bool, never NaN) in [low, high]."""
    ok_type = _is_int(value) if integer else _is_number(value)
    return ok_type and low <= value <= high  # type: ignore[operator]


def valid_text(text: str) -> bool:
    """`text` is valid Unicode: no lone UTF-16 surrogate (which JSON's \\ud800 escapes can smuggle in)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def first_invalid_char(text: str) -> str:
    """Where the first lone surrogate of `text` is, for an error message."""
    index = next(i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF)
    return f"a lone UTF-16 surrogate (U+{ord(text[index]):04X}) at character {index}"


def wrap_seed(seed: int) -> int:
    """`seed` wrapped into [SEED_MIN, SEED_MAX] (sample i of n uses seed + i, which may step past the end)."""
    return (seed - SEED_MIN) % 2**64 + SEED_MIN


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """Per-request sampling and stopping settings.

    temperature 0 means greedy (argmax); top_k 0 or -1 disables top-k; max_tokens None means
    "until the context (max_model_len) is full". Values are validated here (bounds in the module
    docstring), never clamped: a ValueError names the field and what is allowed.
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
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stop_list: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._validate_sampling()
        self._validate_stopping()
        self.stop_list = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])

    def _validate_sampling(self) -> None:
        _check(_in_range(self.n, 1, MAX_N, integer=True), "n", f"an integer in [1, {MAX_N}]", self.n)
        _check(_in_range(self.temperature, 0, MAX_TEMPERATURE), "temperature",
               f"a number in [0, {MAX_TEMPERATURE:g}]", self.temperature)
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "a number in (0, 1]", self.top_p)
        _check(_in_range(self.top_k, -1, MAX_INT32, integer=True), "top_k",
               f"-1, 0 (disabled) or an integer in [1, {MAX_INT32}]", self.top_k)
        _check(_in_range(self.min_p, 0, 1), "min_p", "a number in [0, 1]", self.min_p)
        low, high = REPETITION_PENALTY_RANGE
        _check(_in_range(self.repetition_penalty, low, high), "repetition_penalty",
               f"a number in [{low:g}, {high:g}]", self.repetition_penalty)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_in_range(value, -2, 2), name, "a number in [-2, 2]", value)
        _check(self.seed is None or _in_range(self.seed, SEED_MIN, SEED_MAX, integer=True), "seed",
               "None or an integer in [-2^63, 2^63 - 1]", self.seed)
        _check(self.logprobs is None or _in_range(self.logprobs, 0, MAX_INT32, integer=True), "logprobs",
               "None or an integer >= 0", self.logprobs)
        _check(self.prompt_logprobs is None or _in_range(self.prompt_logprobs, 0, MAX_INT32, integer=True),
               "prompt_logprobs", "None or an integer >= 0", self.prompt_logprobs)
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            _check(isinstance(getattr(self, name), bool), name, "true or false", getattr(self, name))
        _check(isinstance(self.output_kind, RequestOutputKind), "output_kind",
               "a RequestOutputKind (" + ", ".join(k.name for k in RequestOutputKind) + ")", self.output_kind)

    def _validate_stopping(self) -> None:
        _check(self.max_tokens is None or _in_range(self.max_tokens, 1, MAX_INT32, integer=True),
               "max_tokens", f"None or an integer in [1, {MAX_INT32}]", self.max_tokens)
        most = MAX_INT32 if self.max_tokens is None else self.max_tokens
        _check(_in_range(self.min_tokens, 0, most, integer=True), "min_tokens",
               f"an integer in [0, {most}]" + ("" if self.max_tokens is None else " (max_tokens)"), self.min_tokens)
        self._validate_stop()
        ids = self.stop_token_ids
        _check(ids is None or (isinstance(ids, (list, tuple)) and len(ids) <= MAX_STOP_TOKEN_IDS
                               and all(_in_range(t, 0, MAX_INT32, integer=True) for t in ids)),
               "stop_token_ids", f"a list of at most {MAX_STOP_TOKEN_IDS} integers in [0, {MAX_INT32}]", ids)

    def _validate_stop(self) -> None:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        _check(stops is None or (isinstance(stops, (list, tuple)) and len(stops) <= MAX_STOP_STRINGS
                                 and all(isinstance(s, str) and s for s in stops)),
               "stop", f"a non-empty string or a list of at most {MAX_STOP_STRINGS} of them", self.stop)
        for text in stops or []:
            if not valid_text(text):
                raise ValueError(f"stop: must be valid Unicode text, got {first_invalid_char(text)}")

    @property
    def has_penalties(self) -> bool:
        """Repetition, frequency or presence penalty on (sampling then reads the tokens so far)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def clone_for_sample(self, index: int) -> SamplingParams:
        """Parameters of parallel sample `index` of an n > 1 request: n=1, seed offset by the index; only sample 0
        scores the prompt (prompt_logprobs belong to the request, not to a sample)."""
        seed = None if self.seed is None else wrap_seed(self.seed + index)
        prompt_logprobs = self.prompt_logprobs if index == 0 else None
        return SamplingParams(**{**self._init_fields(), "n": 1, "seed": seed, "prompt_logprobs": prompt_logprobs})

    def with_output_kind(self, kind: RequestOutputKind) -> SamplingParams:
        """These parameters asking for `kind`: a copy unless they already do (a caller's object is never
        mutated: LLM.generate and the server pick the kind they need without touching the user's)."""
        if kind is self.output_kind:
            return self
        return SamplingParams(**{**self._init_fields(), "output_kind": kind})

    def _init_fields(self) -> dict:
        names = [f for f in self.__dataclass_fields__ if self.__dataclass_fields__[f].init]
        return {name: getattr(self, name) for name in names}

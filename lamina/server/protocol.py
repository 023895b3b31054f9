"""OpenAI request and response models (OpenAI's field names; vLLM's extra sampling fields accepted).

Range checks are left to SamplingParams, so an error names the same field whether it came from the
offline API or the server; these models only fix types and shapes, strictly (JSON types matter: `true` is
not an integer, `"1"` is not a number). A parameter that would change the answer if honoured but is not
implemented (UNSUPPORTED) is a 400 naming it unless it holds its "off" value; other unknown fields are
ignored (app.py logs them once), as in vLLM.
"""
from __future__ import annotations

import time
from typing import Any, Literal, Union

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from lamina.sampling_params import SamplingParams
from lamina.server.unsupported import Strict as _Strict
from lamina.server.unsupported import Unsupported as _Unsupported

# A completions prompt: text, a batch of texts, token ids, or a batch of token-id lists.
PromptInput = Union[str, list[str], list[int], list[list[int]]]


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingRequest(_Unsupported):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None  # None: the served model
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None  # None: the rest of the context (chat; completions default to 16)
    user: str | None = None
    # vLLM's extra sampling fields
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None,
                         prompt_logprobs: int | None = None) -> SamplingParams:
        """SamplingParams; raises ValueError naming the field (a 400)."""
        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, seed=self.seed, stop=self.stop,
            stop_token_ids=self.stop_token_ids, include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos, max_tokens=max_tokens, min_tokens=self.min_tokens, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, skip_special_tokens=self.skip_special_tokens)


class CompletionRequest(_SamplingRequest):
    prompt: PromptInput
    max_tokens: int | None = 16  # OpenAI's and vLLM's default for completions; null: the rest of the context
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def to_sampling_params(self) -> SamplingParams:
        if self.suffix:
            raise ValueError("suffix: is not supported; send null")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of: only best_of == n is supported, got best_of={self.best_of}, n={self.n}")
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 needs echo=true (score the prompt only); else an integer >= 1 or null")
        # echo + logprobs: the prompt's logprobs too; echo with max_tokens 0 generates one token and drops it
        # (vLLM's way: lm-evaluation-harness scores loglikelihood so)
        max_tokens = 1 if self.echo_only else self.max_tokens
        return self._sampling_params(max_tokens, self.logprobs, self.logprobs if self.echo else None)

    @property
    def echo_only(self) -> bool:
        """echo with max_tokens 0: the answer is the prompt (and its logprobs), no completion."""
        return self.echo and self.max_tokens == 0

    def prompts(self) -> list[str | dict]:
        """The prompt as a list of engine prompts (one per batch entry)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise ValueError("prompt: must not be empty")
        if all(isinstance(p, int) for p in prompt):
            return [{"prompt_token_ids": list(prompt)}]
        return [p if isinstance(p, str) else {"prompt_token_ids": list(p)} for p in prompt]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: Any = None  # not supported: a conversation with tool calls would be rendered without them
    function_call: Any = None

    @field_validator("tool_calls", "function_call", mode="after")
    @classmethod
    def _no_tools(cls, value: Any, info: ValidationInfo) -> Any:
        if value not in (None, []):
            raise ValueError("is not supported by this server (no tool calling); send null or leave it out")
        return value

    def to_template_dict(self) -> dict:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.text for part in content)
        return {"role": self.role, "content": content or ""}


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens; wins when both are set
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true")
        if self.top_logprobs is not None and self.top_logprobs < 0:
            raise ValueError(f"top_logprobs: must be an integer >= 0, got {self.top_logprobs}")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self._sampling_params(max_tokens, logprobs)

    def template_messages(self) -> list[dict]:
        if not self.messages:
            raise ValueError("messages: must not be empty")
        return [m.to_template_dict() for m in self.messages]


# ---- responses ----------------------------------------------------------------------------------------


def _now() -> int:
    return int(time.time())


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    """One entry of GET /v1/models. `max_model_len` is vLLM's field; `vocab_size` is lamina's (prompt token
    ids must be in [0, vocab_size)): `lamina bench serve` reads both to fit its random prompts."""

    id: str
    object: str = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "lamina"
    root: str | None = None
    max_model_len: int | None = None
    vocab_size: int | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]


def dump(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict of a response model."""
    return model.model_dump(mode="json")

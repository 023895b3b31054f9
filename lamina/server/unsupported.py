"""Request parameters lamina does not implement: refused with a 400 naming them, never silently ignored.

Each would change the answer if honoured (a client asking for JSON output must not get prose), so a request
that sets one gets a 400 unless it holds one of its "off" values. Fields not listed here and not in the
request models are ignored (app.py logs each name once), as in vLLM: `user`, `metadata`, `store`, ...
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

# Not implemented, each with the values that mean "off" (accepted): anything else is a 400 naming the field.
UNSUPPORTED: dict[str, tuple] = {
    "logit_bias": (None, {}), "response_format": (None, {"type": "text"}), "tools": (None, []),
    "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
    "guided_decoding_backend": (None,), "guided_whitespace_pattern": (None,), "structured_outputs": (None,),
    "prompt_logprobs": (None,), "logits_processors": (None, []), "allowed_token_ids": (None,),
    "bad_words": (None, []), "use_beam_search": (None, False), "truncate_prompt_tokens": (None,),
    "chat_template": (None,), "chat_template_kwargs": (None, {}), "documents": (None,),
    "continue_final_message": (None, False), "spaces_between_special_tokens": (None, True),
    "audio": (None,), "prediction": (None,),
}
UNSUPPORTED_PREFIX = "guided_"  # vLLM's guided decoding family: any such field is refused, known or not


def unsupported_message(name: str) -> str:
    offs = " or ".join("null" if v is None else repr(v) for v in UNSUPPORTED.get(name, (None,)))
    return f"is not supported by this server (it would change the answer); send {offs} or leave it out"


class Strict(BaseModel):
    """Strictly typed (JSON types matter); unknown fields are dropped."""

    model_config = ConfigDict(extra="ignore", strict=True)


class Unsupported(Strict):
    """The UNSUPPORTED parameters as fields (so a 400 can name them)."""

    logit_bias: Any = None
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    structured_outputs: Any = None
    prompt_logprobs: Any = None
    logits_processors: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    use_beam_search: Any = None
    truncate_prompt_tokens: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None
    documents: Any = None
    continue_final_message: Any = None
    spaces_between_special_tokens: Any = None
    audio: Any = None
    prediction: Any = None

    @field_validator(*UNSUPPORTED, mode="after")
    @classmethod
    def _off(cls, value: Any, info: ValidationInfo) -> Any:
        if not any(type(value) is type(off) and value == off for off in UNSUPPORTED[info.field_name]):
            raise ValueError(unsupported_message(info.field_name))
        return value

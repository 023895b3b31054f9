"""`lamina chat`: a conversation through the model's chat template, replies streamed.

When the conversation outgrows the context, the oldest turns are dropped (the system message stays) and
stderr says so: the chat goes on instead of ending on a "prompt too long" error.

    history:  [system] user assistant user assistant ... user      <- the prompt of the next reply
    fits when prompt tokens + reserve <= max_model_len, reserve = min(max_tokens, max_model_len // 2)
    (max_tokens unset: max_model_len // 2), so a reply always has room to be more than a few tokens.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lamina.cli_output import stream_request
from lamina.sampling_params import SamplingParams

if TYPE_CHECKING:  # the engine pulls in torch: import it only when a command runs
    from lamina.llm import LLM
    from lamina.loader.tokenizer import Tokenizer


@dataclass
class ChatHistory:
    """The messages of one conversation: an optional system message, then alternating turns."""

    system: str | None = None
    turns: list[dict] = field(default_factory=list)  # user, assistant, user, ... (the last may be a user)

    def messages(self) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.turns

    def drop_oldest_turn(self) -> bool:
        """Drop the oldest user message and its reply; False when only the newest user message is left."""
        if len(self.turns) <= 1:
            return False
        del self.turns[:2]
        return True


def reply_reserve(max_tokens: int | None, max_model_len: int) -> int:
    """Tokens kept free for the reply when fitting the history into the context."""
    half = max_model_len // 2
    return half if max_tokens is None else min(max_tokens, half)


def reply_params(params: SamplingParams, num_prompt_tokens: int, max_model_len: int) -> SamplingParams:
    """`params` with max_tokens lowered to the room the context has left (the engine refuses a request whose
    prompt + max_tokens exceeds max_model_len; the chat chooses to answer shorter instead)."""
    room = max_model_len - num_prompt_tokens
    if params.max_tokens is None or params.max_tokens <= room:
        return params
    return replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))


def _prompt_ids(tokenizer: Tokenizer, history: ChatHistory) -> list[int]:
    prompt = tokenizer.apply_chat_template(history.messages(), add_generation_prompt=True)
    # The template already holds any BOS token: encode without adding special tokens again.
    return tokenizer.encode(prompt, add_special_tokens=False)


def fit_history(tokenizer: Tokenizer, history: ChatHistory, max_model_len: int, reserve: int) -> tuple[list[int], int]:
    """The prompt ids of the next reply, after dropping as many oldest turns as it takes to leave `reserve`
    tokens free (or none are left to drop); returns (ids, turns dropped)."""
    ids, dropped = _prompt_ids(tokenizer, history), 0
    while len(ids) + reserve > max_model_len and history.drop_oldest_turn():
        ids, dropped = _prompt_ids(tokenizer, history), dropped + 1
    return ids, dropped


def user_lines() -> Iterator[str]:
    """Lines from a pipe, or from the terminal with a `> ` prompt, until end of input."""
    if not sys.stdin.isatty():
        yield from sys.stdin
        return
    while True:
        try:
            yield input("> ")
        except EOFError:
            return


def chat_loop(llm: LLM, params: SamplingParams, system: str | None) -> int:
    """Answer every line of input, streaming each reply to stdout."""
    tokenizer = llm.get_tokenizer()
    if tokenizer is None:
        raise ValueError("chat: needs a tokenizer (--skip-tokenizer-init was set)")
    max_model_len = llm.engine.max_model_len
    reserve = reply_reserve(params.max_tokens, max_model_len)
    history = ChatHistory(system)
    for line in user_lines():
        if not line.strip():
            continue
        history.turns.append({"role": "user", "content": line.strip()})
        ids, dropped = fit_history(tokenizer, history, max_model_len, reserve)
        if dropped:
            print(f"lamina chat: the conversation no longer fits the context (max_model_len {max_model_len}): "
                  f"dropped the oldest {dropped} turn{'s' if dropped > 1 else ''}", file=sys.stderr, flush=True)
        if len(ids) >= max_model_len:
            history.turns.pop()
            print(f"lamina chat: this message is too long: {len(ids)} prompt tokens leave no room for a reply "
                  f"(max_model_len {max_model_len}); not sent", file=sys.stderr, flush=True)
            continue
        output = stream_request(llm, {"prompt_token_ids": ids}, reply_params(params, len(ids), max_model_len),
                                sys.stdout)
        history.turns.append({"role": "assistant", "content": output.outputs[0].text})
    return 0

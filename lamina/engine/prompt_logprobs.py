"""Prompt logprobs on the engine side: which requests skip the prefix cache, and how the worker's chunks land.

A request that asks for prompt_logprobs must compute its whole prompt (a prefix-cache hit would leave the
cached positions unscored), so it skips the cache until it has its first output token: then every prompt
logprob has arrived (the prompt's last chunk is the step that samples the first token), and a preempted
request may find its prefix in the cache again like any other.

    request.prompt_logprobs: [None, lp(prompt[1]), ..., lp(prompt[P-1])]   complete when len == P
"""
from __future__ import annotations

from lamina.engine.request import Request
from lamina.step import PromptLogprobsChunk


def scores_prompt(request: Request) -> bool:
    """The request still has prompt tokens to score (it must not take a prefix-cache hit)."""
    return request.prompt_logprobs is not None and len(request.prompt_logprobs) < request.num_prompt_tokens


def receive(request: Request, chunk: PromptLogprobsChunk | None) -> None:
    """Append the chunk's entries past those the request holds (a recomputed chunk repeats nothing)."""
    held = request.prompt_logprobs
    if chunk is None or held is None:
        return
    if chunk.start > len(held):
        raise ValueError(f"prompt logprobs of request {request.request_id!r}: got tokens from {chunk.start}, "
                         f"expected {len(held)} (a gap)")
    held.extend(chunk.entries[len(held) - chunk.start:])


def is_complete(request: Request) -> bool:
    return request.prompt_logprobs is not None and len(request.prompt_logprobs) == request.num_prompt_tokens

"""Nothing heavy on the event loop: large prompts are rendered, tokenized and validated on worker threads.

Tokenizing a few megabytes takes seconds; on the event loop that would freeze `/health` and every open stream.
Requests whose body is larger than OFF_LOOP_BODY_BYTES therefore prepare their prompts on a small thread pool
(the tokenizer releases the GIL for long texts: see Tokenizer.encode); small ones stay on the loop, where a
thread hop would cost more than the work.

Before any text is tokenized, `check_prompt_size` refuses at once a prompt with more UTF-8 bytes than
max_model_len tokens can cover (lamina.loader.token_bytes): a too-long prompt costs microseconds, not seconds.
"""
from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from starlette.requests import Request as HTTPRequest

from lamina.loader.token_bytes import utf8_len
from lamina.loader.tokenizer import Tokenizer
from lamina.server import errors

T = TypeVar("T")

OFF_LOOP_BODY_BYTES = 16 * 1024  # bodies above this prepare their prompts on a worker thread
_MAX_WORKERS = min(4, os.cpu_count() or 1)
_pool: ThreadPoolExecutor | None = None


def is_large(http: HTTPRequest) -> bool:
    """Whether the request's body is large enough to prepare off the loop (no Content-Length: assume so)."""
    declared = http.headers.get("content-length", "")
    return not declared.isdigit() or int(declared) > OFF_LOOP_BODY_BYTES


async def run_prepare(fn: Callable[..., T], *args: object, off_loop: bool) -> T:
    """fn(*args), on a worker thread when `off_loop` (its exceptions, APIError included, propagate)."""
    if not off_loop:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(_executor(), functools.partial(fn, *args))


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_MAX_WORKERS, thread_name_prefix="lamina-prepare")
    return _pool


def check_prompt_size(tokenizer: Tokenizer | None, text: str, max_model_len: int, param: str) -> None:
    """400 (context_length_exceeded) without tokenizing when `text` has more bytes than max_model_len tokens
    can cover. A tokenizer that may shrink its input gives no bound: then the tokenizer decides."""
    if len(text) <= max_model_len or tokenizer is None:  # within any bound (it is >= 4 bytes per token)
        return
    per_token = tokenizer.max_bytes_per_token
    if per_token is None:
        return
    limit = max_model_len * per_token
    if 4 * len(text) <= limit:  # a character is at most 4 bytes: certainly within the bound
        return
    size = utf8_len(text)
    if size > limit:
        raise errors.bad_request(
            f"{param}: the prompt is {size:,} bytes of text, more than max_model_len ({max_model_len}) tokens can "
            f"hold (one token covers at most {per_token} bytes): this model's context is too short for it",
            param=param, code="context_length_exceeded")

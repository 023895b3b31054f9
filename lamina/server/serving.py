"""What /v1/completions and /v1/chat/completions share: validation, admission, running and streaming.

    handler: parse -> check model -> SamplingParams -> engine.process (tokenize, validate)
             -> context-length check -> admission (429) -> engine.submit -> collect | stream SSE

Everything before submit raises APIError (a 4xx); nothing reaches the engine until a request is valid.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field

from pydantic import BaseModel
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from lamina.engine.async_engine import AsyncEngine
from lamina.engine.request_stream import EngineDeadError, RequestFailedError, RequestStream
from lamina.engine.input_processor import PromptType
from lamina.engine.request import Request
from lamina.outputs import CompletionOutput, RequestOutput, SampleLogprobs
from lamina.sampling_params import RequestOutputKind, SamplingParams
from lamina.server import errors
from lamina.server.protocol import UsageInfo, dump
from lamina.server.settings import ServerSettings


class ClientDisconnected(Exception):
    """The client went away before a non-streaming response was ready (its request was aborted)."""


@dataclass
class Submitted:
    """The engine streams of one HTTP request: one per prompt of a batch."""

    streams: list[RequestStream]
    n: int

    def close(self) -> None:
        """Abort whatever has not finished (idempotent): the response is over, read or not."""
        for stream in self.streams:
            stream.close()


class EngineStreamingResponse(StreamingResponse):
    """A server-sent event stream that aborts its requests however it ends, even when the client leaves
    before the body generator ever started (then the generator's own cleanup never runs)."""

    def __init__(self, content: AsyncIterator[str], submitted: Submitted) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._submitted = submitted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._submitted.close()


class QueueFull(errors.APIError):
    """429: the queue of requests that cannot be scheduled is at --max-queue; answered with Retry-After."""

    RETRY_AFTER_S = 1  # a slot frees up as soon as any running request finishes

    def __init__(self, max_queue: int) -> None:
        full = errors.queue_full(max_queue)
        super().__init__(full.status, full.message, full.type, full.param, full.code)

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return super().response({"Retry-After": str(self.RETRY_AFTER_S), **(headers or {})})


class OpenAIServing:
    """The request pipeline both POST endpoints run (see the module docstring)."""

    def __init__(self, engine: AsyncEngine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.settings.served_model_name:
            raise errors.model_not_found(model)

    def check_n(self, n: int) -> None:
        if isinstance(n, int) and n > self.settings.max_n:
            raise errors.bad_request(f"n: {n} is above the limit of {self.settings.max_n} (--max-n)", param="n")

    @staticmethod
    def sampling_params(make: Callable[[], SamplingParams], fields: Collection[str],
                        aliases: Mapping[str, str] | None = None, *, stream: bool) -> SamplingParams:
        """The request's SamplingParams, asking for DELTA outputs when it streams (each chunk is built
        from what is new: linear in the length) and FINAL_ONLY when it does not (one output per prompt)."""
        try:
            params = make()
        except ValueError as err:
            raise errors.from_value_error(err, fields, aliases) from err
        kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
        return params.with_output_kind(kind)

    def process(self, prompt: PromptType, params: SamplingParams, request_id: str, fields: Collection[str],
                aliases: Mapping[str, str] | None = None) -> list[Request]:
        """Tokenize and validate one prompt; a ValueError becomes a 400 naming the field."""
        try:
            requests = self.engine.process(prompt, params, request_id)
        except ValueError as err:
            api_error = errors.from_value_error(err, fields, aliases)
            if "max_model_len" in api_error.message:
                api_error.code = "context_length_exceeded"
            raise api_error from err
        return requests

    def admit(self, num_seqs: int) -> None:
        """429 (with Retry-After) when this request would leave more than max_queue sequences unable to
        run for lack of sequence slots or KV blocks. Requests merely waiting for their prefill turn do
        not count; the bound is hard: admit and submit run back to back on the event loop, and the
        count moves with every submission (AsyncEngine.queued_seqs_after)."""
        limit = self.settings.max_queue
        if limit is not None and self.engine.queued_seqs_after(num_seqs) > limit:
            raise QueueFull(limit)

    def submit(self, batch: list[tuple[str, list[Request]]], n: int) -> Submitted:
        self.admit(sum(len(requests) for _, requests in batch))
        submitted = Submitted([], n)
        try:
            for request_id, requests in batch:
                submitted.streams.append(self.engine.submit(request_id, requests))
        except EngineDeadError as err:
            submitted.close()
            raise errors.engine_dead(str(err)) from err
        return submitted

    async def respond(self, submitted: Submitted, http: HTTPRequest,
                      stream: Callable[[], AsyncIterator[str]] | None,
                      build: Callable[[list[RequestOutput]], BaseModel]) -> Response:
        """Server-sent events when `stream` is given; else wait for every output and answer
        `build(outputs)` as JSON (499 when the client left first: its requests were aborted)."""
        if stream is not None:
            return EngineStreamingResponse(stream(), submitted)
        try:
            outputs = await self.collect(submitted, http)
        except ClientDisconnected:
            return Response(status_code=499)
        return JSONResponse(dump(build(outputs)))

    async def collect(self, submitted: Submitted, http: HTTPRequest) -> list[RequestOutput]:
        """The final output of every prompt; aborts them all if the client disconnects first."""
        finals: list[RequestOutput | None] = [None] * len(submitted.streams)

        async def run() -> None:
            async with aclosing(merge(submitted.streams)) as outputs:
                async for index, output in outputs:
                    finals[index] = output

        work = asyncio.ensure_future(run())
        watch = asyncio.ensure_future(wait_for_disconnect(http))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, watch):
                task.cancel()
            await asyncio.gather(work, watch, return_exceptions=True)
            submitted.close()  # `work` may have been cancelled before it ever ran
        if not work.done() or work.cancelled():
            raise ClientDisconnected()
        if work.exception() is not None:
            raise _as_api_error(work.exception())
        return [f for f in finals if f is not None]


async def wait_for_disconnect(http: HTTPRequest) -> None:
    """Return when the client closes the connection (the body has been read already)."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return


async def merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) from several streams as they arrive; closes (aborts) all of them at the end."""
    pending = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = pending.pop(task)
                try:
                    output = task.result()
                except StopAsyncIteration:
                    continue
                yield index, output
                pending[asyncio.ensure_future(streams[index].__anext__())] = index
    finally:
        for task in pending:
            task.cancel()
        for stream in streams:
            stream.close()


def _as_api_error(err: BaseException) -> BaseException:
    if isinstance(err, EngineDeadError):
        return errors.engine_dead(str(err))
    if isinstance(err, RequestFailedError):  # logged by the engine already: no second traceback
        return errors.request_failed(str(err))
    if isinstance(err, ValueError):
        return errors.bad_request(str(err))
    return err


def usage_of(outputs: list[RequestOutput]) -> UsageInfo:
    """Usage of complete (FINAL_ONLY) outputs, one per prompt."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def sse(data: dict | str) -> str:
    """One server-sent event."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


def sse_error(err: BaseException) -> str:
    api_error = _as_api_error(err)
    if not isinstance(api_error, errors.APIError):
        api_error = errors.APIError(500, f"internal error: {err!r}", type="server_error")
    return sse(api_error.body())


SSE_DONE = sse("[DONE]")


@dataclass
class Chunk:
    """What one streamed chunk of a choice carries: new text and the tokens (and logprobs) behind it."""

    text: str
    token_ids: list[int]
    logprobs: SampleLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None


@dataclass
class ChoiceCursor:
    """One choice of a stream, fed its DELTA outputs: the tokens not yet sent and the counts so far."""

    num_tokens: int = 0  # tokens received: the choice's completion_tokens
    text_offset: int = 0  # completions logprobs: characters of token text sent so far
    started: bool = False
    finished: bool = False
    text_free: bool = False  # no tokenizer: every delta with tokens is a chunk (empty text, its token ids)
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: SampleLogprobs = field(default_factory=list)

    def advance(self, delta: CompletionOutput) -> Chunk | None:
        """The chunk for one DELTA output; None while there is no new text to send (without a tokenizer:
        no new tokens).

        Tokens whose text is still held back (a stop string may cut it, or a character is incomplete)
        wait here and ride along with the chunk that carries their text, so logprobs match the text.
        """
        if self.finished:
            return None
        self.num_tokens += len(delta.token_ids)
        self.pending_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.pending_logprobs.extend(delta.logprobs)
        finished = delta.finish_reason is not None
        if not delta.text and not finished and not (self.text_free and self.pending_ids):
            return None
        chunk = Chunk(delta.text, self.pending_ids, self.pending_logprobs if delta.logprobs is not None else None,
                      delta.finish_reason, delta.stop_reason)
        self.pending_ids, self.pending_logprobs, self.finished = [], [], finished
        return chunk


def stream_usage(prompt_tokens: Mapping[int, int], cursors: Iterable[ChoiceCursor]) -> UsageInfo:
    """Usage of a streamed response: prompt tokens per prompt index, completion tokens counted as the
    deltas passed (no output of a DELTA stream holds a whole completion)."""
    prompt = sum(prompt_tokens.values())
    completion = sum(c.num_tokens for c in cursors)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def finite(logprob: float | None) -> float:
    """A logprob JSON can carry: -inf (and a missing value) become -9999.0, as vLLM does."""
    return -9999.0 if logprob is None or logprob != logprob else max(logprob, -9999.0)

"""POST /v1/chat/completions: messages through the model's chat template, OpenAI chat completions out."""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from fastapi.responses import Response
from starlette.requests import Request as HTTPRequest

from lamina.engine.request import Request
from lamina.outputs import CompletionOutput, RequestOutput, SampleLogprobs
from lamina.sampling_params import SamplingParams
from lamina.server import errors
from lamina.server.offload import check_prompt_size, is_large, run_prepare
from lamina.server.protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
                                    ChatCompletionResponse, ChatLogprobs, ChatResponseMessage, ChatTokenLogprob,
                                    DeltaMessage, TopLogprob, dump)
from lamina.outputs import token_text, top_entries
from lamina.server.serving import (SSE_DONE, ChoiceCursor, OpenAIServing, Submitted, finite, merge, sse,
                                   sse_error, stream_usage, usage_of)

FIELDS = frozenset(ChatCompletionRequest.model_fields)


@dataclass
class _Context:
    request_id: str
    model: str
    top_logprobs: int | None  # None: no logprobs
    include_usage: bool


def _aliases(body: ChatCompletionRequest) -> dict[str, str]:
    aliases = {"prompt": "messages", "prompt_token_ids": "messages", "logprobs": "top_logprobs"}
    if body.max_completion_tokens is not None:
        aliases["max_tokens"] = "max_completion_tokens"
    return aliases


def _render(serving: OpenAIServing, body: ChatCompletionRequest) -> dict:
    """The conversation as an engine prompt: template text plus its token ids (no extra BOS)."""
    tokenizer = serving.engine.tokenizer
    if tokenizer is None:
        raise errors.bad_request("messages: chat needs a tokenizer; the server runs without one", "messages")
    try:
        text = tokenizer.apply_chat_template(body.template_messages(), body.add_generation_prompt)
    except Exception as err:  # noqa: BLE001 - jinja raises its own types for a template the messages break
        raise errors.bad_request(f"messages: the chat template cannot render them: {err}", "messages") from err
    if not text:
        raise errors.bad_request("messages: the chat template rendered an empty prompt", "messages")
    check_prompt_size(tokenizer, text, serving.engine.max_model_len, "messages")
    return {"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}


def _prepare(serving: OpenAIServing, body: ChatCompletionRequest, params: SamplingParams, request_id: str,
             aliases: dict[str, str]) -> list[Request]:
    """Render, tokenize and validate (on a worker thread for a large body: see offload)."""
    return serving.process(_render(serving, body), params, request_id, FIELDS, aliases)


async def create_chat_completion(serving: OpenAIServing, body: ChatCompletionRequest,
                                 http: HTTPRequest) -> Response:
    serving.check_model(body.model)
    serving.check_n(body.n)
    aliases = _aliases(body)
    params = serving.sampling_params(body.to_sampling_params, FIELDS, aliases, stream=body.stream)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    requests = await run_prepare(_prepare, serving, body, params, request_id, aliases, off_loop=is_large(http))
    submitted = serving.submit([(request_id, requests)], params.n)
    ctx = _Context(request_id, body.model or serving.settings.served_model_name, params.logprobs,
                   body.include_usage())
    stream = (lambda: _stream(ctx, submitted)) if body.stream else None
    return await serving.respond(submitted, http, stream, lambda outputs: _response(ctx, outputs))


def _response(ctx: _Context, outputs: list[RequestOutput]) -> ChatCompletionResponse:
    choices = [_choice(ctx, c) for c in outputs[0].outputs]
    return ChatCompletionResponse(id=ctx.request_id, model=ctx.model, choices=choices, usage=usage_of(outputs))


def _choice(ctx: _Context, completion: CompletionOutput) -> ChatChoice:
    logprobs = None
    if ctx.top_logprobs is not None and completion.logprobs is not None:
        logprobs = chat_logprobs(completion.logprobs, completion.token_ids, ctx.top_logprobs)
    return ChatChoice(index=completion.index, message=ChatResponseMessage(content=completion.text),
                      logprobs=logprobs, finish_reason=completion.finish_reason,
                      stop_reason=completion.stop_reason)


def _top(logprob: float, text: str) -> TopLogprob:
    return TopLogprob(token=text, logprob=finite(logprob), bytes=list(text.encode("utf-8")))


def chat_logprobs(entries: SampleLogprobs, token_ids: list[int], num_top: int) -> ChatLogprobs:
    """OpenAI chat logprobs ({"content": [...]}) for the given tokens."""
    content = []
    for token_id, entry in zip(token_ids, entries):
        chosen = entry.get(token_id)
        text = token_text(chosen, token_id)
        top = [_top(lp.logprob, token_text(lp, tid)) for tid, lp in top_entries(entry, num_top)]
        content.append(ChatTokenLogprob(token=text, logprob=finite(chosen.logprob if chosen else None),
                                        bytes=list(text.encode("utf-8")), top_logprobs=top))
    return ChatLogprobs(content=content)


async def _stream(ctx: _Context, submitted: Submitted) -> AsyncIterator[str]:
    """SSE chunks from the request's DELTA outputs, as they arrive."""
    cursors: dict[int, ChoiceCursor] = {}
    prompt_tokens: dict[int, int] = {}
    try:
        async with aclosing(merge(submitted.streams)) as outputs:
            async for _, output in outputs:
                prompt_tokens[0] = len(output.prompt_token_ids)
                for delta in output.outputs:
                    cursor = cursors.setdefault(delta.index, ChoiceCursor())
                    for chunk in _chunks(ctx, delta, cursor):
                        yield sse(chunk)
        if ctx.include_usage:
            usage = stream_usage(prompt_tokens, cursors.values())
            yield sse(dump(ChatCompletionChunk(id=ctx.request_id, model=ctx.model, choices=[], usage=usage)))
    except Exception as err:  # noqa: BLE001 - reported to the client as an error event
        yield sse_error(err)
    yield SSE_DONE


def _chunks(ctx: _Context, delta: CompletionOutput, cursor: ChoiceCursor) -> list[dict]:
    """The role chunk first (once per choice), then the new content with its finish_reason."""
    chunks = []
    if not cursor.started:
        cursor.started = True
        chunks.append(_chunk(ctx, ChatChunkChoice(index=delta.index,
                                                  delta=DeltaMessage(role="assistant", content=""))))
    chunk = cursor.advance(delta)
    if chunk is None:
        return chunks
    logprobs = None
    if ctx.top_logprobs is not None and chunk.logprobs is not None:
        logprobs = chat_logprobs(chunk.logprobs, chunk.token_ids, ctx.top_logprobs)
    message = DeltaMessage(content=chunk.text) if chunk.text else DeltaMessage()
    chunks.append(_chunk(ctx, ChatChunkChoice(index=delta.index, delta=message, logprobs=logprobs,
                                              finish_reason=chunk.finish_reason)))
    return chunks


def _chunk(ctx: _Context, choice: ChatChunkChoice) -> dict:
    return dump(ChatCompletionChunk(id=ctx.request_id, model=ctx.model, choices=[choice]))

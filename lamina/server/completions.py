"""POST /v1/completions: a prompt (or a batch of them) in, OpenAI text completions out."""
from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

from fastapi.responses import Response
from starlette.requests import Request as HTTPRequest

from lamina.engine.input_processor import PromptType
from lamina.engine.request import Request
from lamina.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestOutput
from lamina.sampling_params import SamplingParams
from lamina.server import errors
from lamina.server.offload import check_prompt_size, is_large, run_prepare
from lamina.server.protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
                                    dump)
from lamina.outputs import token_text, top_entries
from lamina.server.serving import (SSE_DONE, ChoiceCursor, Chunk, OpenAIServing, Submitted, finite, merge, sse,
                                   sse_error, stream_usage, usage_of)

FIELDS = frozenset(CompletionRequest.model_fields)
ALIASES = {"prompt_token_ids": "prompt"}


@dataclass
class _Context:
    request_id: str
    model: str
    n: int
    logprobs: int | None
    echo: bool
    include_usage: bool
    tokenizer: object | None
    echo_only: bool = False  # echo with max_tokens 0: the one token generated is dropped

    def decode(self, token_id: int) -> str:
        """A prompt token's text where no logprob entry carries it (the first prompt token)."""
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


async def create_completion(serving: OpenAIServing, body: CompletionRequest, http: HTTPRequest) -> Response:
    serving.check_model(body.model)
    serving.check_n(body.n)
    params = serving.sampling_params(body.to_sampling_params, FIELDS, ALIASES, stream=body.stream)
    try:
        prompts = body.prompts()
    except ValueError as err:
        raise errors.from_value_error(err, FIELDS, ALIASES) from err
    request_id = f"cmpl-{uuid.uuid4().hex}"
    batch = await run_prepare(_prepare, serving, prompts, params, request_id, off_loop=is_large(http))
    submitted = serving.submit(batch, params.n)
    ctx = _Context(request_id, body.model or serving.settings.served_model_name, params.n, body.logprobs,
                   body.echo, body.include_usage(), serving.engine.tokenizer, body.echo_only)
    stream = (lambda: _stream(ctx, submitted)) if body.stream else None
    return await serving.respond(submitted, http, stream, lambda outputs: _response(ctx, outputs))


def _prepare(serving: OpenAIServing, prompts: list[PromptType], params: SamplingParams,
             request_id: str) -> list[tuple[str, list[Request]]]:
    """Every prompt tokenized and validated (on a worker thread for a large body: see offload)."""
    batch = []
    for i, prompt in enumerate(prompts):
        text = prompt if isinstance(prompt, str) else None
        if isinstance(prompt, dict) and "prompt_token_ids" not in prompt and isinstance(prompt.get("prompt"), str):
            text = prompt["prompt"]
        if text is not None:
            check_prompt_size(serving.engine.tokenizer, text, serving.engine.max_model_len, "prompt")
        batch.append((f"{request_id}-{i}", serving.process(prompt, params, f"{request_id}-{i}", FIELDS, ALIASES)))
    return batch


def _response(ctx: _Context, outputs: list[RequestOutput]) -> CompletionResponse:
    if ctx.echo_only:
        outputs = [dataclasses.replace(o, outputs=[_drop_tokens(c) for c in o.outputs]) for o in outputs]
    choices = [_choice(ctx, i * ctx.n + c.index, out, c) for i, out in enumerate(outputs) for c in out.outputs]
    return CompletionResponse(id=ctx.request_id, model=ctx.model, choices=choices, usage=usage_of(outputs))


def _prompt_text(ctx: _Context, output: RequestOutput) -> str:
    if output.prompt is not None:
        return output.prompt
    return ctx.tokenizer.decode(output.prompt_token_ids) if ctx.tokenizer is not None else ""


def _drop_tokens(completion: CompletionOutput) -> CompletionOutput:
    """An echo-only choice: no completion text, tokens or logprobs (the token generated is not part of it)."""
    logprobs = None if completion.logprobs is None else []
    return dataclasses.replace(completion, text="", token_ids=[], logprobs=logprobs, cumulative_logprob=None)


def _choice(ctx: _Context, index: int, output: RequestOutput, completion: CompletionOutput) -> CompletionChoice:
    text = _prompt_text(ctx, output) + completion.text if ctx.echo else completion.text
    logprobs = None
    if ctx.logprobs is not None and completion.logprobs is not None:
        entries, token_ids = _with_prompt(ctx, output.prompt_token_ids, output.prompt_logprobs,
                                          completion.logprobs, completion.token_ids)
        logprobs = completion_logprobs(entries, token_ids, ctx.logprobs, 0, ctx.decode)
    return CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=completion.finish_reason,
                            stop_reason=completion.stop_reason)


def _with_prompt(ctx: _Context, prompt_ids: list[int], prompt_logprobs: PromptLogprobs | None,
                 entries: Sequence[dict[int, Logprob] | None], token_ids: list[int]
                 ) -> tuple[list[dict[int, Logprob] | None], list[int]]:
    """echo: the prompt's tokens and logprobs before the completion's (OpenAI's echo covers both)."""
    if not ctx.echo:
        return list(entries), token_ids
    if prompt_logprobs is None:
        raise ValueError("echo with logprobs: the engine returned no prompt logprobs")
    return list(prompt_logprobs) + list(entries), list(prompt_ids) + list(token_ids)


def completion_logprobs(entries: Sequence[dict[int, Logprob] | None], token_ids: list[int], num_top: int,
                        offset: int, decode: Callable[[int], str] | None = None) -> CompletionLogprobs:
    """OpenAI's legacy logprobs object for the given tokens; text offsets start at `offset`. An entry None (the
    first prompt token: nothing predicts it) gives logprob null, top_logprobs null and the text `decode` gives."""
    result = CompletionLogprobs()
    for token_id, entry in zip(token_ids, entries):
        if entry is None:
            text = decode(token_id) if decode is not None else f"token_id:{token_id}"
            result.tokens.append(text)
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            result.text_offset.append(offset)
            offset += len(text)
            continue
        chosen = entry.get(token_id)
        text = token_text(chosen, token_id)
        result.tokens.append(text)
        result.token_logprobs.append(finite(chosen.logprob) if chosen is not None else None)
        result.text_offset.append(offset)
        offset += len(text)
        result.top_logprobs.append({token_text(lp, tid): finite(lp.logprob) for tid, lp in top_entries(entry, num_top)})
    return result


async def _stream(ctx: _Context, submitted: Submitted) -> AsyncIterator[str]:
    """SSE chunks from the prompts' DELTA outputs, as they arrive."""
    cursors: dict[int, ChoiceCursor] = {}
    prompt_tokens: dict[int, int] = {}
    prompt_logprobs: dict[int, PromptLogprobs] = {}  # DELTA: they come once, maybe before the first chunk
    try:
        async with aclosing(merge(submitted.streams)) as outputs:
            async for prompt_index, output in outputs:
                prompt_tokens[prompt_index] = len(output.prompt_token_ids)
                if output.prompt_logprobs is not None:
                    prompt_logprobs[prompt_index] = output.prompt_logprobs
                for delta in output.outputs:
                    index = prompt_index * ctx.n + delta.index
                    cursor = cursors.setdefault(index, ChoiceCursor(text_free=ctx.tokenizer is None))
                    chunk = cursor.advance(_drop_tokens(delta) if ctx.echo_only else delta)
                    if chunk is not None:
                        yield sse(_chunk(ctx, index, output, chunk, cursor, prompt_logprobs.get(prompt_index)))
        if ctx.include_usage:
            usage = stream_usage(prompt_tokens, cursors.values())
            yield sse(dump(CompletionResponse(id=ctx.request_id, model=ctx.model, choices=[], usage=usage)))
    except Exception as err:  # noqa: BLE001 - reported to the client as an error event
        yield sse_error(err)
    yield SSE_DONE


def _chunk(ctx: _Context, index: int, output: RequestOutput, chunk: Chunk, cursor: ChoiceCursor,
           prompt_logprobs: PromptLogprobs | None) -> dict:
    text = chunk.text
    first_echo = ctx.echo and not cursor.started
    if first_echo:
        text = _prompt_text(ctx, output) + text
    cursor.started = True
    logprobs = None
    if ctx.logprobs is not None and chunk.logprobs is not None:
        entries, token_ids = chunk.logprobs, chunk.token_ids
        if first_echo:
            entries, token_ids = _with_prompt(ctx, output.prompt_token_ids, prompt_logprobs, entries, token_ids)
        logprobs = completion_logprobs(entries, token_ids, ctx.logprobs, cursor.text_offset, ctx.decode)
        cursor.text_offset += sum(len(t) for t in logprobs.tokens)
    choice = CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=chunk.finish_reason,
                              stop_reason=chunk.stop_reason)
    data = dump(CompletionResponse(id=ctx.request_id, model=ctx.model, choices=[choice]))
    if ctx.tokenizer is None:  # the text is empty: the token ids are the content (vLLM's `token_ids`)
        data["choices"][0]["token_ids"] = list(chunk.token_ids)
    return data

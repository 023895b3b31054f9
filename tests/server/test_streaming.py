"""Streaming is built from DELTA outputs: streamed choices (text, logprobs, finish, usage) equal the
non-streamed answer to the same seeded request, stop strings included; metrics count whole requests."""
from __future__ import annotations

import openai
import pytest

from lamina import RequestOutputKind
from tests.server.harness import MODEL_NAME, RunningServer, scrape

PROMPT = "class Point:"
SAMPLED = dict(n=2, seed=5, temperature=0.9, max_tokens=16, extra_body={"ignore_eos": True})
MESSAGES = [{"role": "user", "content": "def add(a, b):"}]


def stop_of(text: str) -> str:
    assert len(text) > 10
    return text[6:9]


def joined_completions(chunks: list) -> dict[int, dict]:
    """Streamed completion choices joined per index: text, logprobs lists, finish and stop reasons."""
    choices: dict[int, dict] = {}
    for chunk in chunks:
        for c in chunk.choices:
            got = choices.setdefault(c.index, dict(text="", tokens=[], token_logprobs=[], top_logprobs=[],
                                                   text_offset=[], finish_reason=None, stop_reason=None))
            assert got["finish_reason"] is None, "a chunk after the choice's finish"
            got["text"] += c.text
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                got[name] += getattr(c.logprobs, name)
            got["finish_reason"], got["stop_reason"] = c.finish_reason, getattr(c, "stop_reason", None)
    return choices


def test_streamed_completions_equal_the_non_streamed_answer(client: openai.OpenAI) -> None:
    first = client.completions.create(model=MODEL_NAME, prompt=PROMPT, **SAMPLED)
    stop = stop_of(first.choices[0].text)
    kwargs = dict(model=MODEL_NAME, prompt=PROMPT, logprobs=2, stop=stop, **SAMPLED)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    streamed = joined_completions([c for c in chunks if c.choices])
    assert whole.choices[0].finish_reason == "stop" and stop not in whole.choices[0].text
    for choice in whole.choices:
        got, lp = streamed[choice.index], choice.logprobs
        assert got["text"] == choice.text and got["finish_reason"] == choice.finish_reason
        assert got["stop_reason"] == getattr(choice, "stop_reason", None)
        assert (got["tokens"], got["token_logprobs"]) == (lp.tokens, lp.token_logprobs)
        assert (got["top_logprobs"], got["text_offset"]) == (lp.top_logprobs, lp.text_offset)
    assert chunks[-1].usage == whole.usage and not chunks[-1].choices


def test_streamed_chat_equals_the_non_streamed_answer(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, **SAMPLED)
    stop = stop_of(first.choices[0].message.content)
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, logprobs=True, top_logprobs=2, stop=stop, **SAMPLED)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text, logprobs, finish = {0: "", 1: ""}, {0: [], 1: []}, {}
    for chunk in chunks:
        for c in chunk.choices:
            assert c.index not in finish, "a chunk after the choice's finish"
            text[c.index] += c.delta.content or ""
            logprobs[c.index] += c.logprobs.content if c.logprobs else []
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    assert whole.choices[0].finish_reason == "stop" and stop not in whole.choices[0].message.content
    for choice in whole.choices:
        assert text[choice.index] == choice.message.content and finish[choice.index] == choice.finish_reason
        assert logprobs[choice.index] == choice.logprobs.content
    assert chunks[-1].usage == whole.usage


def test_streams_ask_the_engine_for_deltas_and_metrics_count_whole_requests(server: RunningServer,
                                                                           client: openai.OpenAI,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    processor = server.engine.engine.output_processor
    kinds = []
    add_group = processor.add_group
    monkeypatch.setattr(processor, "add_group",
                        lambda rid, reqs: (kinds.append(reqs[0].sampling_params.output_kind), add_group(rid, reqs)))
    before = scrape(server.url)["lamina:generation_tokens_total"]
    list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, stream=True, **SAMPLED))
    client.completions.create(model=MODEL_NAME, prompt=PROMPT, **SAMPLED)
    assert kinds == [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY]
    # the hook sees each request's whole output, not its last delta: 2 requests x n=2 x 16 tokens
    assert scrape(server.url)["lamina:generation_tokens_total"] - before == 2 * 2 * 16
    server.engine.check_integrity()

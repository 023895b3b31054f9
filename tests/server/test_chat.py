"""/v1/chat/completions: the chat template, streaming deltas and logprobs, against LLM.chat."""
from __future__ import annotations

import openai

from lamina import LLM, SamplingParams
from tests.server.harness import MODEL_NAME

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "def add(a, b):"}]


def offline_chat(offline: LLM, **params: object) -> tuple[str, int]:
    out = offline.chat(MESSAGES, SamplingParams(**params), use_tqdm=False)[0]
    return out.outputs[0].text, len(out.prompt_token_ids)


def test_chat_text_and_usage_match_offline_chat(client: openai.OpenAI, offline: LLM) -> None:
    text, num_prompt = offline_chat(offline, temperature=0, max_tokens=10, ignore_eos=True)
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=10, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (num_prompt, 10)
    newer = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_completion_tokens=10,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert newer.choices[0].message.content == text


def test_content_parts_render_like_plain_text(client: openai.OpenAI) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "def add(a, b):"}]}]
    plain = [{"role": "user", "content": "def add(a, b):"}]
    a = client.chat.completions.create(model=MODEL_NAME, messages=parts, max_tokens=5, temperature=0)
    b = client.chat.completions.create(model=MODEL_NAME, messages=plain, max_tokens=5, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_chat_streaming_deltas(client: openai.OpenAI, offline: LLM) -> None:
    text, _ = offline_chat(offline, temperature=0, max_tokens=12, ignore_eos=True)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    body = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in body) == text
    assert body[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices


def test_chat_n_and_logprobs(client: openai.OpenAI, offline: LLM) -> None:
    out = offline.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=4, logprobs=3, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 3 for t in content)
    expected = [entry[token].logprob for entry, token in zip(out.logprobs, out.token_ids)]
    assert all(abs(t.logprob - e) < 1e-4 for t, e in zip(content, expected))
    assert all(t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob for t in content)
    n = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, n=2, max_tokens=3, seed=1)
    assert sorted(c.index for c in n.choices) == [0, 1]

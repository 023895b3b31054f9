"""/v1/completions and /v1/models through the official openai client, against the offline LLM."""
from __future__ import annotations

import httpx
import openai

from lamina import LLM, SamplingParams
from tests.server.harness import MODEL_NAME, RunningServer

PROMPT = "def add(a, b):"


def offline_text(offline: LLM, prompt: str | dict, **params: object) -> tuple[str, list[int], str]:
    out = offline.generate(prompt, SamplingParams(**params), use_tqdm=False)[0]
    return out.outputs[0].text, out.outputs[0].token_ids, out.outputs[0].finish_reason


def test_models_lists_the_served_model(client: openai.OpenAI, server: RunningServer) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].model_extra["max_model_len"] == server.engine.max_model_len
    assert models[0].model_extra["vocab_size"] == 320  # lamina's field: prompt ids in [0, vocab_size)


def test_completion_text_and_usage_match_offline(client: openai.OpenAI, offline: LLM) -> None:
    text, ids, _ = offline_text(offline, PROMPT, temperature=0, max_tokens=12, ignore_eos=True)
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == MODEL_NAME and len(r.choices) == 1
    assert r.choices[0].text == text and r.choices[0].finish_reason == "length"
    num_prompt = len(offline.get_tokenizer().encode(PROMPT))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (num_prompt, 12,
                                                                                       num_prompt + 12)


def test_max_tokens_defaults_to_16_as_in_openai_and_vllm(client: openai.OpenAI, server: RunningServer) -> None:
    r = client.completions.create(model=MODEL_NAME, prompt=[5, 6, 7], temperature=0,
                                  extra_body={"ignore_eos": True})
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.choices[0].finish_reason) == (3, 16, "length")
    body = {"model": MODEL_NAME, "prompt": [5, 6, 7], "max_tokens": None, "temperature": 0, "ignore_eos": True}
    r = httpx.post(server.base_url + "/completions", json=body, timeout=60).json()  # null: the rest of the context
    assert r["usage"]["completion_tokens"] == server.engine.max_model_len - 3


def test_chat_max_tokens_defaults_to_the_rest_of_the_context(client: openai.OpenAI, server: RunningServer) -> None:
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens + r.usage.completion_tokens == server.engine.max_model_len
    assert r.choices[0].finish_reason == "length"


def test_token_ids_batch_and_n(client: openai.OpenAI, offline: LLM) -> None:
    text, _, _ = offline_text(offline, {"prompt_token_ids": [10, 20, 30]}, temperature=0, max_tokens=6,
                              ignore_eos=True)
    r = client.completions.create(model=MODEL_NAME, prompt=[[10, 20, 30], [40, 50]], max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].text == text
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 12
    batch = client.completions.create(model=MODEL_NAME, prompt=[PROMPT, "class Point:"], max_tokens=4,
                                      temperature=0)
    assert len(batch.choices) == 2
    n = client.completions.create(model=MODEL_NAME, prompt=PROMPT, n=3, max_tokens=8, temperature=1.0, seed=7,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in n.choices) == [0, 1, 2] and n.usage.completion_tokens == 24
    again = client.completions.create(model=MODEL_NAME, prompt=PROMPT, n=3, max_tokens=8, temperature=1.0,
                                      seed=7, extra_body={"ignore_eos": True})
    assert [c.text for c in again.choices] == [c.text for c in n.choices]  # seeded: reproducible


def test_stop_and_sampling_fields_follow_offline_semantics(client: openai.OpenAI, offline: LLM) -> None:
    full, _, _ = offline_text(offline, PROMPT, temperature=0, max_tokens=16, ignore_eos=True)
    stop = full[5:8]
    text, _, reason = offline_text(offline, PROMPT, temperature=0, max_tokens=16, ignore_eos=True, stop=[stop])
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == text and stop not in text and r.choices[0].finish_reason == reason == "stop"
    sampled = dict(temperature=0.8, top_p=0.9, seed=3, frequency_penalty=0.5, presence_penalty=0.3, max_tokens=10)
    extras = dict(top_k=20, min_p=0.01, repetition_penalty=1.1, ignore_eos=True, min_tokens=2)
    text, _, _ = offline_text(offline, PROMPT, **sampled, **extras)
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, extra_body=extras, **sampled)
    assert r.choices[0].text == text


def test_logprobs_and_echo(client: openai.OpenAI, offline: LLM) -> None:
    out = offline.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5, logprobs=2, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    expected = [entry[token].logprob for entry, token in zip(out.logprobs, out.token_ids)]
    assert all(abs(a - b) < 1e-4 for a, b in zip(lp.token_logprobs, expected))
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    echo = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0, echo=True,
                                     extra_body={"ignore_eos": True})
    assert echo.choices[0].text == PROMPT + r.choices[0].text


def test_streaming_concatenates_to_the_full_text(client: openai.OpenAI, offline: LLM) -> None:
    text, _, _ = offline_text(offline, PROMPT, temperature=0, max_tokens=20, ignore_eos=True)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    body = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in body) == text
    assert body[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in body[:-1]) and all(c.usage is None for c in body)
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 20


def test_streaming_with_a_stop_string_never_shows_the_stop(client: openai.OpenAI, offline: LLM) -> None:
    full, _, _ = offline_text(offline, PROMPT, temperature=0, max_tokens=16, ignore_eos=True)
    stop = full[6:9]
    text, _, _ = offline_text(offline, PROMPT, temperature=0, max_tokens=16, ignore_eos=True, stop=stop)
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in stream) == text


def test_raw_sse_ends_with_done(server: RunningServer) -> None:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "stream": True, "n": 2}
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1

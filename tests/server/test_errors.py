"""Bad input never crashes the server and never gets a 500: OpenAI error bodies naming the field."""
from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.harness import MODEL_NAME, RunningServer

BASE = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 4}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

# (body overrides, status, param, code)
COMPLETION_ERRORS = [
    ({"temperature": -0.5}, 400, "temperature", None),
    ({"temperature": "hot"}, 400, "temperature", None),
    ({"top_p": 0}, 400, "top_p", None),
    ({"top_p": 1.5}, 400, "top_p", None),
    ({"max_tokens": 0}, 400, "max_tokens", None),
    ({"max_tokens": -3}, 400, "max_tokens", None),
    ({"max_tokens": 10_000}, 400, "max_tokens", "context_length_exceeded"),
    ({"prompt": ""}, 400, "prompt", None),
    ({"prompt": []}, 400, "prompt", None),
    ({"prompt": [1, 2, 9999]}, 400, "prompt", None),
    ({"prompt": [[3, 4], [-1]]}, 400, "prompt", None),
    ({"prompt": [7] * 200}, 400, "prompt", "context_length_exceeded"),
    ({"n": 5}, 400, "n", None),
    ({"n": 0}, 400, "n", None),
    ({"logprobs": 21}, 400, "logprobs", None),
    ({"frequency_penalty": 3}, 400, "frequency_penalty", None),
    ({"presence_penalty": -2.5}, 400, "presence_penalty", None),
    ({"stop": [""]}, 400, "stop", None),
    ({"seed": "x"}, 400, "seed", None),
    ({"top_k": -2}, 400, "top_k", None),
    ({"min_p": 2}, 400, "min_p", None),
    ({"min_tokens": 9, "max_tokens": 4}, 400, "min_tokens", None),
    ({"logit_bias": {"5": 1.0}}, 400, "logit_bias", None),
    ({"model": "gpt-17"}, 404, "model", "model_not_found"),
]

CHAT_ERRORS = [
    ({"messages": []}, 400, "messages", None),
    ({"messages": [{"role": 5, "content": "hi"}]}, 400, "messages", None),
    ({"messages": [{"content": "hi"}]}, 400, "messages", None),
    ({"messages": "hi"}, 400, "messages", None),
    ({"top_logprobs": 2}, 400, "top_logprobs", None),
    ({"logprobs": True, "top_logprobs": 50}, 400, "top_logprobs", None),
    ({"max_completion_tokens": 0}, 400, "max_completion_tokens", None),
    ({"max_tokens": 10_000}, 400, "max_tokens", "context_length_exceeded"),
    ({"temperature": -1}, 400, "temperature", None),
    ({"model": "nope"}, 404, "model", "model_not_found"),
]


def post(server: RunningServer, path: str, **kwargs: object) -> httpx.Response:
    return httpx.post(server.base_url + path, timeout=30, **kwargs)


def assert_error(r: httpx.Response, status: int, param: str | None, code: str | None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code), error
    return error


@pytest.mark.parametrize(("override", "status", "param", "code"), COMPLETION_ERRORS)
def test_completion_errors(server: RunningServer, override: dict, status: int, param: str,
                           code: str | None) -> None:
    assert_error(post(server, "/completions", json={**BASE, **override}), status, param, code)


@pytest.mark.parametrize(("override", "status", "param", "code"), CHAT_ERRORS)
def test_chat_errors(server: RunningServer, override: dict, status: int, param: str, code: str | None) -> None:
    assert_error(post(server, "/chat/completions", json={**CHAT, **override}), status, param, code)


def test_the_openai_client_sees_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL_NAME, prompt="hi", temperature=-1)
    assert bad.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2]", b"\xff\xfe"])
def test_malformed_json_is_a_400(server: RunningServer, content: bytes) -> None:
    r = post(server, "/completions", content=content, headers={"content-type": "application/json"})
    assert_error(r, 400, None, None)


def test_missing_required_field_names_it(server: RunningServer) -> None:
    assert_error(post(server, "/completions", json={"model": MODEL_NAME}), 400, "prompt", None)


def test_oversized_body_is_refused(server: RunningServer) -> None:
    big = {**BASE, "prompt": "x" * (server.settings.max_body_bytes + 10)}
    assert_error(post(server, "/completions", json=big), 413, None, "request_too_large")


def test_oversized_chunked_body_is_refused(server: RunningServer) -> None:
    def chunks():  # no content-length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"x" * 8192
        yield b'"}'

    assert_error(post(server, "/completions", content=chunks()), 413, None, "request_too_large")


def test_unknown_route_and_method_are_openai_errors(server: RunningServer) -> None:
    assert_error(httpx.get(server.base_url + "/nothing-here"), 404, None, None)
    assert_error(httpx.get(server.base_url + "/completions"), 405, None, None)


def test_server_is_healthy_and_leak_free_after_bad_input(server: RunningServer, client: openai.OpenAI) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    r = client.completions.create(model=MODEL_NAME, prompt="hello", max_tokens=3)
    assert r.usage.completion_tokens >= 1
    server.engine.check_integrity()
    assert server.engine.num_inflight_seqs == 0

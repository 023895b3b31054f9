"""Issue 10, reproducers 2 and 5: hostile or loose input is a 4xx naming the field, never a 500, and never a
traceback in the log (client errors are not server errors)."""
from __future__ import annotations

import logging
import socket

import httpx
import openai
import pytest

from lamina.server import errors
from lamina.server.body import decode_json
from tests.server.harness import MODEL_NAME, RunningServer

BASE = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 4}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
JSON = {"content-type": "application/json"}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logs() -> _Records:
    """Log records of uvicorn and lamina during the test (uvicorn's loggers do not reach the root)."""
    handler = _Records()
    names = ("uvicorn", "uvicorn.error", "lamina")
    for name in names:
        logging.getLogger(name).addHandler(handler)
    yield handler
    for name in names:
        logging.getLogger(name).removeHandler(handler)
    tracebacks = [r.getMessage() for r in handler.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not tracebacks, f"a client error was logged as a server error: {tracebacks}"


def raw_post(server: RunningServer, path: str, body: str | bytes) -> httpx.Response:
    """POST a body as written (json= would re-encode it): lone surrogates, huge numbers, deep nesting."""
    content = body.encode() if isinstance(body, str) else body
    return httpx.post(server.base_url + path, content=content, headers=JSON, timeout=30)


def error_of(r: httpx.Response, status: int, param: str | None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    return error


# ---- reproducer 2: 500s -------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "body", "param"), [
    ("/completions", '{"model": "tiny-llama", "prompt": "\\ud800", "max_tokens": 4}', "prompt"),
    ("/completions", '{"prompt": ["ok", "bad \\udc00 text"], "max_tokens": 4}', "prompt"),
    ("/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 4}', "messages"),
    ("/chat/completions", '{"messages": [{"role": "\\ud800", "content": "hi"}], "max_tokens": 4}', "messages"),
    ("/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\\udfff"}]}]}', "messages"),
    ("/completions", '{"model": "\\ud800", "prompt": "hi"}', "model"),
    ("/completions", '{"prompt": "hi", "stop": ["\\ud83d"]}', "stop"),
    ("/completions", '{"prompt": "hi", "\\ud800": 1}', "\\ud800"),  # a key: named as it was escaped
])
def test_lone_surrogates_are_a_400_naming_the_field(server: RunningServer, logs: _Records, path: str, body: str,
                                                    param: str | None) -> None:
    error = error_of(raw_post(server, path, body), 400, param)
    assert "surrogate" in error["message"]


def test_a_surrogate_pair_is_valid_text(server: RunningServer, logs: _Records) -> None:
    r = raw_post(server, "/completions", '{"prompt": "smile \\ud83d\\ude00", "max_tokens": 2}')
    assert r.status_code == 200, r.text


def test_an_error_body_with_a_lone_surrogate_still_encodes() -> None:
    response = errors.model_not_found("\ud800x").response()
    assert response.status_code == 404 and b"\\\\ud800x" in response.body


@pytest.mark.parametrize("body", [
    '{"prompt": "hi", "max_tokens": ' + "9" * 5000 + "}",
    '{"prompt": "hi", "whatever": ' + "1" * 5000 + "}",
])
def test_a_number_of_5000_digits_is_a_400(server: RunningServer, logs: _Records, body: str) -> None:
    assert "digits" in error_of(raw_post(server, "/completions", body), 400, None)["message"]


@pytest.mark.parametrize("depth", [30_000, 2_000])  # the test server's body limit is 64 KiB
def test_deep_nesting_is_a_400(server: RunningServer, logs: _Records, depth: int) -> None:
    body = '{"prompt": "hi", "x": ' + "[" * depth + "]" * depth + "}"
    assert "nested too deeply" in error_of(raw_post(server, "/completions", body), 400, None)["message"]


def test_nesting_100000_deep_is_refused_by_the_decoder() -> None:
    with pytest.raises(errors.APIError, match="nested too deeply") as refused:
        decode_json(b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert refused.value.status == 400


def test_a_half_sent_body_is_handled_quietly(server: RunningServer, logs: _Records) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 1000\r\n\r\n{\"prompt\": \"hel")
    r = httpx.post(server.base_url + "/completions", json=BASE, timeout=30)  # the server goes on
    assert r.status_code == 200, r.text


# ---- reproducer 5: loose validation -------------------------------------------------------------------

@pytest.mark.parametrize(("override", "param"), [
    ({"n": True}, "n"), ({"temperature": "1"}, "temperature"), ({"max_tokens": 4.0}, "max_tokens"),
    ({"top_k": True}, "top_k"), ({"stream": "yes"}, "stream"), ({"prompt": [1, True]}, "prompt"),
    ({"seed": 2**64}, "seed"), ({"seed": -(2**63) - 1}, "seed"), ({"top_k": 2**63}, "top_k"),
    ({"repetition_penalty": 1e-300}, "repetition_penalty"), ({"temperature": 1e308}, "temperature"),
    ({"max_tokens": 10**12}, "max_tokens"), ({"ignore_eos": 1}, "ignore_eos"),
])
def test_fields_are_strictly_typed_and_bounded(server: RunningServer, logs: _Records, override: dict,
                                               param: str) -> None:
    error_of(httpx.post(server.base_url + "/completions", json={**BASE, **override}, timeout=30), 400, param)


@pytest.mark.parametrize(("override", "param"), [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"guided_choice": ["a", "b"]}, "guided_choice"),
    ({"guided_something_new": "x"}, "guided_something_new"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
    ({"use_beam_search": True}, "use_beam_search"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]}, "messages"),
])
def test_unimplemented_parameters_are_refused_by_name(server: RunningServer, logs: _Records, override: dict,
                                                      param: str) -> None:
    r = httpx.post(server.base_url + "/chat/completions", json={**CHAT, **override}, timeout=30)
    assert "not supported" in error_of(r, 400, param)["message"]


def test_off_values_and_unknown_fields_are_accepted_and_logged_once(server: RunningServer, logs: _Records,
                                                                    client: openai.OpenAI) -> None:
    extra = {"user": "u1", "metadata": {"k": "v"}, "store": False, "response_format": {"type": "text"},
             "tools": [], "tool_choice": "none", "logit_bias": {}, "some_future_field": 3}
    for _ in range(2):
        r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2, extra_body=extra)
        assert r.choices[0].finish_reason in ("stop", "length")
    ignored = [r.getMessage() for r in logs.records if "ignoring the unknown request field" in r.getMessage()]
    assert sum("some_future_field" in m for m in ignored) <= 1  # once per process (another test may have)


def test_the_openai_client_sees_strict_types(client: openai.OpenAI, logs: _Records) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2, extra_body={"n": True})
    assert bad.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                       response_format={"type": "json_object"})
    assert bad.value.body["param"] == "response_format"


def test_healthy_and_leak_free_after_hostile_input(server: RunningServer) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    server.engine.check_integrity()
    assert server.engine.num_inflight_seqs == 0

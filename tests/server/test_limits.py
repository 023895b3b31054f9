"""--api-key, --max-queue (429) and client disconnects, on a server with one running slot and no queue."""
from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.harness import MODEL_NAME, RunningServer, make_engine, scrape, start_server, wait_until

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# greedy: the first token has text of its own ("mp"), so its line arrives before the engine is held (a sampled
# first token may be a partial UTF-8 character, which the detokenizer holds back until a later step)
STREAM = {"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 100, "stream": True, "ignore_eos": True,
          "temperature": 0}


@pytest.fixture(scope="module")
def strict(model_dir: str) -> RunningServer:
    running = start_server(make_engine(model_dir, max_num_seqs=1), api_key=KEY, max_queue=0)
    yield running
    running.engine.check_integrity()
    running.stop()


def test_api_key_is_required_on_v1_but_not_on_health(strict: RunningServer) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.get(strict.base_url + "/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(strict.base_url + "/completions", json={"model": MODEL_NAME, "prompt": "hi"})
    assert r.status_code == 401
    assert httpx.get(strict.url + "/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=strict.base_url, api_key="wrong", max_retries=0).models.list()
    good = openai.OpenAI(base_url=strict.base_url, api_key=KEY, max_retries=0)
    assert good.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).usage.completion_tokens >= 1


def test_a_full_queue_gets_429(strict: RunningServer) -> None:
    client = openai.OpenAI(base_url=strict.base_url, api_key=KEY, max_retries=0)
    strict.gate.pause_after(2)  # prefill + one decode step, then the engine holds: the stream cannot finish
    with httpx.stream("POST", strict.base_url + "/completions", json=STREAM, headers=AUTH, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # running: it holds the one slot
        with pytest.raises(openai.RateLimitError) as err:
            client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
        assert err.value.status_code == 429 and err.value.body["type"] == "rate_limit_error"
        strict.gate.resume()
        assert [line for line in lines if line][-1] == "data: [DONE]"
    assert client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).choices[0].finish_reason


def test_disconnect_mid_stream_aborts_and_frees_kv_blocks(strict: RunningServer) -> None:
    before = scrape(strict.url).get('lamina:request_success_total{finished_reason="abort"}', 0.0)
    steps = strict.engine.get_stats().num_steps
    strict.gate.pause_after(2)  # the request cannot finish on its own before the server sees the disconnect
    with httpx.stream("POST", strict.base_url + "/completions", json=STREAM, headers=AUTH, timeout=30) as r:
        lines = r.iter_lines()  # keep a reference: a dropped iterator closes the connection early
        assert next(lines).startswith("data: ")
        wait_until(lambda: strict.engine.get_stats().num_steps == steps + 2, what="the decode step")
        assert scrape(strict.url)["lamina:kv_cache_usage_perc"] > 0
    wait_until(lambda: strict.engine.num_inflight_seqs == 0, what="the server to notice the disconnect")
    strict.gate.resume()
    wait_until(lambda: scrape(strict.url)["lamina:kv_cache_usage_perc"] == 0.0, what="KV blocks to be freed")
    metrics = scrape(strict.url)
    assert metrics['lamina:request_success_total{finished_reason="abort"}'] == before + 1
    assert metrics["lamina:num_requests_running"] == 0 and metrics["lamina:num_requests_waiting"] == 0
    strict.engine.check_integrity()


def test_disconnect_before_a_non_streaming_response_aborts(strict: RunningServer) -> None:
    before = scrape(strict.url).get('lamina:request_success_total{finished_reason="abort"}', 0.0)
    strict.gate.pause_after(1)
    body = {**STREAM, "stream": False}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(strict.base_url + "/completions", json=body, headers=AUTH, timeout=0.5)
    wait_until(lambda: strict.engine.num_inflight_seqs == 0, what="the server to notice the disconnect")
    strict.gate.resume()
    wait_until(lambda: scrape(strict.url).get('lamina:request_success_total{finished_reason="abort"}', 0) == before + 1,
               what="the abort to be counted")
    assert scrape(strict.url)["lamina:kv_cache_usage_perc"] == 0.0
    strict.engine.check_integrity()

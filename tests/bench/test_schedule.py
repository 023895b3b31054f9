"""Arrival schedules (no sleeping), URLs, SSE decoding, payloads."""
from __future__ import annotations

import math

import numpy as np
import pytest

from lamina.bench.datasets import SampleRequest
from lamina.bench.serve import ClientConfig, SSEDecoder, api_url, arrival_schedule, build_payload


def test_poisson_inter_arrivals_have_mean_one_over_rate():
    times = np.array(arrival_schedule(20_001, request_rate=4.0, seed=0))
    gaps = np.diff(times)
    assert times[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1
    assert np.mean(gaps < 0.25) == pytest.approx(1 - math.exp(-1), abs=0.02)


def test_burstiness_keeps_the_mean_and_changes_the_spread():
    gaps = np.diff(arrival_schedule(20_001, request_rate=2.0, burstiness=4.0, seed=1))
    assert gaps.mean() == pytest.approx(0.5, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(0.5, abs=0.05)  # gamma: CV = 1 / sqrt(shape)


def test_schedule_is_seeded_and_inf_is_all_at_once():
    assert arrival_schedule(10, 3.0, seed=5) == arrival_schedule(10, 3.0, seed=5)
    assert arrival_schedule(10, 3.0, seed=5) != arrival_schedule(10, 3.0, seed=6)
    assert arrival_schedule(7, math.inf) == [0.0] * 7
    with pytest.raises(ValueError, match="--request-rate"):
        arrival_schedule(3, 0.0)


def test_api_url():
    assert api_url("http://h:8000") == "http://h:8000/v1/completions"
    assert api_url("http://h:8000/v1/") == "http://h:8000/v1/completions"
    assert api_url("https://h/api/v1", "/v1/models") == "https://h/api/v1/models"
    with pytest.raises(ValueError, match="--base-url"):
        api_url("h:8000")


def test_sse_decoder():
    d = SSEDecoder()
    lines = [": ping", "", "event: x", "data: {\"a\":", "data:1}", "", "data: [DONE]"]
    events = [e for e in (d.feed(line) for line in lines) if e is not None]
    assert events == ['{"a":\n1}']
    assert d.flush() == "[DONE]" and d.flush() is None


def test_payload():
    cfg = ClientConfig(api_url="http://h/v1/completions", model="m", ignore_eos=True, extra_body={"top_k": 1})
    body = build_payload(cfg, SampleRequest([1, 2, 3], 3, 7))
    assert body == {"model": "m", "prompt": [1, 2, 3], "max_tokens": 7, "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": True, "top_k": 1}
    assert "ignore_eos" not in build_payload(ClientConfig("u", "m"), SampleRequest("x", 1, 1))
    with pytest.raises(ValueError, match="--max-concurrency"):
        ClientConfig("u", "m", max_concurrency=0)


def test_sse_decoder_on_network_bytes():
    d = SSEDecoder()
    assert d.feed_bytes(b'data: {"x": "\xc3') == []
    assert d.feed_bytes(b'\xa9"}\r\n\r\ndata: [DO') == ['{"x": "\u00e9"}']
    assert d.feed_bytes(b"NE]") == [] and d.flush() == "[DONE]"

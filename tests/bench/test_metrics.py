"""Metric math on hand-made records: percentiles, TTFT/TPOT/ITL/E2E, throughput, goodput, JSON keys."""
from __future__ import annotations

import math

import pytest

from lamina.bench.metrics import (RequestRecord, format_summary, format_sweep, parse_goodput, percentile,
                                  summarize)


def test_percentile_linear_interpolation():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([], 50) == 0.0
    with pytest.raises(ValueError, match="percentile"):
        percentile(values, 101)


def _records() -> list[RequestRecord]:
    a = RequestRecord(10, 5, success=True, ttft=0.1, itl=[0.02] * 4, latency=0.18, output_tokens=5)
    b = RequestRecord(20, 3, success=True, ttft=0.3, itl=[0.05, 0.05], latency=0.4, output_tokens=3)
    c = RequestRecord(30, 1, success=True, ttft=0.2, latency=0.2, output_tokens=1)
    bad = RequestRecord(40, 4, success=False, error="HTTP 429: slow down")
    return [a, b, c, bad]


def test_summary_matches_definitions():
    s = summarize(_records(), duration_s=2.0, request_rate=4.0, percentiles=(50.0, 99.0))
    assert (s.completed, s.failed) == (3, 1)
    assert s.total_input_tokens == 60 and s.total_output_tokens == 9
    assert s.request_throughput == pytest.approx(1.5) and s.output_throughput == pytest.approx(4.5)
    assert s.total_token_throughput == pytest.approx(34.5)
    assert s.ttft.mean == pytest.approx(200.0) and s.ttft.median == pytest.approx(200.0)
    # TPOT = (e2e - ttft) / (n - 1), only for requests with more than one token: 20 ms and 50 ms
    assert s.tpot.mean == pytest.approx(35.0) and s.tpot.percentiles[99.0] == pytest.approx(49.7)
    assert s.itl.mean == pytest.approx((4 * 20 + 2 * 50) / 6) and s.itl.median == pytest.approx(20.0)
    assert s.e2el.mean == pytest.approx(260.0)
    assert s.request_goodput is None
    assert s.errors == {"HTTP 429: slow down": 1}


def test_goodput_counts_requests_meeting_every_slo():
    records = _records()
    # a: ttft 100 tpot 20; b: ttft 300 tpot 50; c: ttft 200 tpot 0 (one token)
    assert summarize(records, 2.0, 1.0, slos={"ttft": 250}).request_goodput == pytest.approx(1.0)
    assert summarize(records, 2.0, 1.0, slos={"ttft": 250, "tpot": 10}).request_goodput == pytest.approx(0.5)
    assert summarize(records, 2.0, 1.0, slos={"e2el": 1000}).request_goodput == pytest.approx(1.5)
    assert summarize(records, 2.0, 1.0, slos={"ttft": 1}).request_goodput == 0.0


def test_parse_goodput():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput(None) == {}
    for bad in ("ttft", "itl:5", "ttft:fast", "tpot:-1"):
        with pytest.raises(ValueError, match="--goodput"):
            parse_goodput([bad])


def test_all_failed_gives_zeros_not_errors():
    s = summarize([RequestRecord(1, 1, error="boom")] * 3, 1.0, math.inf)
    assert s.completed == 0 and s.failed == 3 and s.ttft.mean == 0.0 and s.errors == {"boom": 3}
    assert "Failed requests:" in format_summary(s)


def test_json_keys_and_tables():
    s = summarize(_records(), 2.0, math.inf, max_concurrency=8, slos={"ttft": 250})
    point = s.to_json()
    assert point["request_rate"] == "inf" and point["max_concurrency"] == 8
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99"):
            assert isinstance(point[f"{stat}_{name}_ms"], float)
    assert point["request_goodput"] == pytest.approx(1.0) and point["failed"] == 1
    text = format_summary(s)
    assert "Mean TTFT (ms):" in text and "P99 ITL (ms):" in text and "Request goodput" in text
    assert len(format_sweep([s, summarize(_records(), 2.0, 2.0)]).splitlines()) == 3

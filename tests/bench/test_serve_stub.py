"""The client against a stub OpenAI-compatible server with known timing (loose bounds: machines are noisy)."""
from __future__ import annotations

import math

import pytest

from lamina.bench.datasets import SampleRequest
from lamina.bench.metrics import summarize
from lamina.bench.serve import ClientConfig, api_url, arrival_schedule, benchmark
from tests.bench.stub_server import MODEL, StubConfig, StubServer


def _requests(n: int, out: int = 8) -> list[SampleRequest]:
    return [SampleRequest(list(range(10 + i)), 10 + i, out) for i in range(n)]


def _cfg(stub: StubServer, **kw: object) -> ClientConfig:
    return ClientConfig(api_url=api_url(stub.base_url), model=MODEL, disable_tqdm=True, **kw)


def test_timings_match_what_the_stub_did():
    stub_cfg = StubConfig(ttft_s=0.1, itl_s=0.02)
    with StubServer(stub_cfg) as stub:
        [run] = benchmark(_cfg(stub, api_key="sk-test", ignore_eos=True), _requests(6), [math.inf])
    assert all(r.success for r in run.records), [r.error for r in run.records]
    for i, r in enumerate(run.records):
        assert r.prompt_len == 10 + i  # dataset order; the stub's usage.prompt_tokens
        assert r.output_tokens == 8 and r.usage_reported
        assert len(r.itl) == 7  # 8 one-token chunks; the bare finish chunk is not a token
        assert 0.1 <= r.ttft < 2.0
        assert 0.0 < r.latency - r.ttft < 3.0  # the stub spent 7 gaps of 20 ms
        assert r.tpot == pytest.approx((r.latency - r.ttft) / 7)
    s = summarize(run.records, run.duration_s, math.inf, slos={"ttft": 60_000})
    assert s.completed == 6 and s.failed == 0 and s.total_output_tokens == 48
    assert 10 <= s.itl.mean < 500 and 10 <= s.tpot.mean < 500  # 20 ms on the stub
    assert s.request_throughput == pytest.approx(6 / run.duration_s)
    assert s.request_goodput == pytest.approx(s.request_throughput)
    assert summarize(run.records, run.duration_s, math.inf, slos={"ttft": 1}).request_goodput == 0.0
    body, headers = stub.state.bodies[-1], stub.state.headers[-1]
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["ignore_eos"]
    assert isinstance(body["prompt"], list) and body["model"] == MODEL
    assert headers["authorization"] == "Bearer sk-test"
    assert len(stub.state.bodies) == 7  # one warm-up + 6


def test_without_usage_tokens_are_counted_by_chunk():
    with StubServer(StubConfig(honour_usage=False, finish_chunk=False)) as stub:
        [run] = benchmark(_cfg(stub), _requests(3, out=5), [math.inf])
    records = [(r.success, r.output_tokens, r.usage_reported, len(r.itl)) for r in run.records]
    assert records == [(True, 5, False, 4)] * 3


def test_multi_token_chunks_use_the_usage_count():
    with StubServer(StubConfig(tokens_per_chunk=3)) as stub:
        [run] = benchmark(_cfg(stub), _requests(2, out=9), [math.inf])
    assert [(r.output_tokens, len(r.itl)) for r in run.records] == [(9, 2)] * 2


def test_inf_sends_all_at_once_and_concurrency_caps():
    with StubServer(StubConfig(ttft_s=0.5, itl_s=0.01)) as stub:
        benchmark(_cfg(stub, num_warmups=0), _requests(8, out=2), [math.inf])
        assert stub.state.max_in_flight == 8
    with StubServer(StubConfig(ttft_s=0.1, itl_s=0.01)) as stub:
        [run] = benchmark(_cfg(stub, num_warmups=0, max_concurrency=2), _requests(6, out=2), [math.inf])
        assert stub.state.max_in_flight <= 2 and all(r.success for r in run.records)


def test_finite_rate_follows_the_schedule():
    rate = 20.0
    with StubServer(StubConfig(ttft_s=0.01, itl_s=0.005)) as stub:
        [run] = benchmark(_cfg(stub, num_warmups=0, seed=3), _requests(10, out=2), [rate])
    schedule = arrival_schedule(10, rate, seed=3)
    starts = [r.start_time for r in run.records]
    assert all(s >= t - 1e-3 for s, t in zip(starts, schedule))  # never early
    assert run.duration_s >= schedule[-1]


def test_server_errors_are_failed_requests_not_crashes():
    with StubServer(StubConfig(fail_every=3)) as stub:
        [run] = benchmark(_cfg(stub, num_warmups=0), _requests(9, out=3), [math.inf])
    failed = [r for r in run.records if not r.success]
    assert len(failed) == 3
    assert sorted(r.error.split(":")[0] for r in failed) == ["HTTP 400", "HTTP 429", "HTTP 500"]
    s = summarize(run.records, run.duration_s, math.inf)
    assert s.completed == 6 and s.failed == 3 and sum(s.errors.values()) == 3


def test_unreachable_server():
    with StubServer() as stub:
        url = stub.base_url
    cfg = ClientConfig(api_url=api_url(url), model=MODEL, disable_tqdm=True, num_warmups=0, timeout_s=5)
    [run] = benchmark(cfg, _requests(2), [math.inf])
    assert not any(r.success for r in run.records) and all(r.error for r in run.records)
    with pytest.raises(ValueError, match="warm-up request .* failed"):
        benchmark(ClientConfig(api_url=api_url(url), model=MODEL, disable_tqdm=True), _requests(1), [1.0])

"""Fault injection and admission on a real server (issue 10): a forward that raises mid-batch, a sampler
that raises for one row, a broken engine, and --max-queue as a hard bound on requests that cannot be
scheduled (429 with Retry-After). Each ends with check_integrity() and the gauges back at 0."""
from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
import torch

from lamina import SamplingParams
from lamina.engine.async_engine import AsyncEngine
from lamina.engine.request_stream import EngineDeadError
from tests.server.harness import MODEL_NAME, RunningServer, make_engine, scrape, start_server, wait_until

MARKED = 0.77  # the temperature of the request the fake sampler fails on
BODY = {"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 6, "temperature": 0, "ignore_eos": True}


def settle(server: RunningServer) -> None:
    wait_until(lambda: server.engine.num_inflight_seqs == 0, what="requests to finish")
    wait_until(lambda: (lambda m: m["lamina:num_requests_running"] == m["lamina:num_requests_waiting"] == 0)(
        scrape(server.url)), what="the gauges to reach 0")
    server.engine.check_integrity()
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.fixture
def served(model_dir: str) -> RunningServer:
    running = start_server(make_engine(model_dir))
    yield running
    running.stop()


def post(server: RunningServer, body: dict, path: str = "/completions") -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=30)


def test_a_forward_that_raises_fails_its_requests_only(served: RunningServer, monkeypatch) -> None:
    runner = served.engine.engine.executor.worker.runner
    forward = runner._forward

    def out_of_memory(*args: object) -> torch.Tensor:
        monkeypatch.setattr(runner, "_forward", forward)
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    reference = post(served, BODY).json()["choices"][0]["text"]
    monkeypatch.setattr(runner, "_forward", out_of_memory)
    failed = post(served, BODY)
    assert failed.status_code == 500 and "OutOfMemoryError" in failed.json()["error"]["message"]
    after = post(served, BODY)
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == reference
    settle(served)


def test_a_streamed_request_whose_step_fails_gets_an_error_event(served: RunningServer, monkeypatch) -> None:
    runner = served.engine.engine.executor.worker.runner
    forward, calls = runner._forward, []

    def fails_third(*args: object) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(*args)

    monkeypatch.setattr(runner, "_forward", fails_third)
    with httpx.stream("POST", served.base_url + "/completions", json={**BODY, "stream": True}, timeout=30) as r:
        events = [line for line in r.iter_lines() if line]
    assert r.status_code == 200 and any('"error"' in e and "OutOfMemoryError" in e for e in events)
    settle(served)


def test_a_sampler_that_raises_for_one_row_fails_that_request_only(served: RunningServer, monkeypatch) -> None:
    runner = served.engine.engine.executor.worker.runner
    sampler = runner.sampler
    reference = post(served, BODY).json()["choices"][0]["text"]

    def sample(logits: torch.Tensor, metadata, argmax=None):
        temps = metadata.temperature
        if temps is not None and bool(((temps - MARKED).abs() < 1e-4).any()):
            raise ValueError("probability tensor contains nan (simulated)")
        return sampler(logits, metadata, argmax=argmax)

    monkeypatch.setattr(runner, "sampler", sample)
    served.gate.pause_after(0)  # both requests enter the same batch
    results: dict[str, httpx.Response] = {}
    bad = {**BODY, "temperature": MARKED, "n": 2}
    threads = [threading.Thread(target=lambda k=k, b=b: results.__setitem__(k, post(served, b)))
               for k, b in (("good", BODY), ("bad", bad))]
    for t in threads:
        t.start()
    wait_until(lambda: served.engine.num_inflight_seqs == 3, what="both requests to be queued")
    served.gate.resume()
    for t in threads:
        t.join(30)
    assert results["bad"].status_code == 500 and "sampling failed" in results["bad"].json()["error"]["message"]
    assert results["good"].status_code == 200 and results["good"].json()["choices"][0]["text"] == reference
    settle(served)


def test_a_broken_engine_fails_in_flight_requests_and_calls_on_dead(model_dir: str, monkeypatch) -> None:
    llm_engine = make_engine(model_dir)
    dead: list[BaseException] = []
    engine = AsyncEngine(llm_engine, on_dead=dead.append)

    def lost(*args: object) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(llm_engine.executor.worker.runner, "_forward", lost)

    async def run() -> None:
        async for _ in engine.generate("x", SamplingParams(max_tokens=4), "r"):
            pass

    with pytest.raises(EngineDeadError, match="device failed"):
        asyncio.run(asyncio.wait_for(run(), 10))
    wait_until(lambda: bool(dead), what="on_dead")
    assert not engine.is_alive and "illegal memory access" in repr(dead[0].__cause__)
    llm_engine.check_integrity()
    engine.shutdown()


# ---- admission: --max-queue bounds the requests that cannot be scheduled, hard -----------------------

def _hold_streams(server: RunningServer, bodies: list[dict]) -> list:
    """Open one stream per body (in threads); returns the threads and their responses' status codes."""
    codes: list[int] = []

    def run(body: dict) -> None:
        with httpx.stream("POST", server.base_url + "/completions", json={**body, "stream": True}, timeout=30) as r:
            codes.append(r.status_code)
            for _ in r.iter_lines():
                pass

    threads = [threading.Thread(target=run, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    return [threads, codes]


def test_waiting_for_a_prefill_turn_is_not_queueing(model_dir: str) -> None:
    server = start_server(make_engine(model_dir, max_num_seqs=4, max_num_batched_tokens=8), max_queue=0)
    try:
        server.gate.pause_after(0)
        long = {**BODY, "prompt": list(range(1, 31)), "max_tokens": 20}
        threads, codes = _hold_streams(server, [long, long, long])
        wait_until(lambda: server.engine.num_inflight_seqs == 3, what="three requests")
        server.gate.pause_after(2)  # 8 tokens a step: the first prompt takes both, the others wait
        wait_until(lambda: server.engine.get_stats().num_steps == 2, what="two prefill chunks")
        assert server.engine.get_stats().num_waiting >= 2  # waiting for their turn, slots and blocks free
        threads4, codes4 = _hold_streams(server, [long])  # the 4th slot: admitted
        wait_until(lambda: server.engine.num_inflight_seqs == 4, what="the 4th request")
        r = post(server, BODY)  # no slot left and max_queue 0
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        server.gate.resume()
        for t in threads + threads4:
            t.join(30)
        assert codes + codes4 == [200] * 4
        settle(server)
    finally:
        server.stop()


def test_requests_held_back_by_kv_blocks_count_against_max_queue(model_dir: str) -> None:
    engine = make_engine(model_dir, max_num_seqs=4, num_kv_blocks=12, max_model_len=40, enable_prefix_caching=False)
    server = start_server(engine, max_queue=1)
    try:
        server.gate.pause_after(1)
        first = {**BODY, "prompt": list(range(1, 31)), "max_tokens": 8}
        second = {**BODY, "prompt": list(range(40, 70)), "max_tokens": 8}
        threads, codes = _hold_streams(server, [first])
        wait_until(lambda: server.engine.get_stats().num_running == 1, what="the first request to run")
        more, more_codes = _hold_streams(server, [second])  # 8 blocks each: it waits for blocks
        wait_until(lambda: server.engine.num_inflight_seqs == 2, what="the second request")
        server.gate.pause_after(3)  # the step it is in, the one launched ahead, then one that schedules
        wait_until(lambda: server.engine.get_stats().num_steps == 4, what="three more steps")
        assert server.engine.get_stats().kv_limited
        r = post(server, {**BODY, "prompt": [5, 6, 7]})  # 2 held back > max_queue 1, slots free or not
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        server.gate.resume()
        for t in threads + more:
            t.join(30)
        assert codes + more_codes == [200, 200]
        settle(server)
    finally:
        server.stop()

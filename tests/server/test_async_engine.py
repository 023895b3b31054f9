"""AsyncEngine without HTTP: outputs, validation, abort on early exit, engine failure, idle loop."""
from __future__ import annotations

import asyncio
import time

import pytest

from lamina import LLM, SamplingParams
from lamina.engine.async_engine import AsyncEngine
from lamina.engine.request_stream import EngineDeadError
from tests.server.harness import StepGate, make_engine, wait_until

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture
def engine(model_dir: str) -> AsyncEngine:
    running = AsyncEngine(make_engine(model_dir))
    yield running
    running.shutdown()


async def run_all(engine: AsyncEngine, prompt: str, params: SamplingParams, request_id: str) -> list:
    return [out async for out in engine.generate(prompt, params, request_id)]


def test_generate_streams_cumulative_outputs_equal_to_offline(engine: AsyncEngine, offline: LLM) -> None:
    outputs = asyncio.run(run_all(engine, "class Point:", GREEDY, "a"))
    assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
    lengths = [len(o.outputs[0].token_ids) for o in outputs]
    assert lengths == sorted(lengths) and lengths[-1] == 10
    expected = offline.generate("class Point:", GREEDY, use_tqdm=False)[0].outputs[0]
    assert outputs[-1].outputs[0].token_ids == expected.token_ids
    assert outputs[-1].outputs[0].text == expected.text
    engine.check_integrity()


def test_validation_errors_raise_before_anything_is_queued(engine: AsyncEngine) -> None:
    with pytest.raises(ValueError, match="prompt"):
        asyncio.run(run_all(engine, "", GREEDY, "empty"))
    with pytest.raises(ValueError, match="prompt_token_ids"):
        engine.process({"prompt_token_ids": [10**6]}, GREEDY, "oob")
    assert engine.num_inflight_seqs == 0
    assert engine.call(lambda e: e.has_unfinished_requests()).result(5) is False


def test_a_consumer_that_stops_early_aborts_its_request(engine: AsyncEngine) -> None:
    async def first_then_stop() -> None:
        params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        agen = engine.generate("def add(a, b):", params, "early")
        await agen.__anext__()
        await agen.aclose()

    finished = []
    engine.on_finished = finished.append
    asyncio.run(first_then_stop())
    wait_until(lambda: bool(finished), what="the abort")
    assert finished[0].outputs[0].finish_reason == "abort" and len(finished[0].outputs[0].token_ids) < 100
    wait_until(lambda: engine.get_stats().kv_usage == 0.0, what="KV blocks to be freed")
    engine.check_integrity()


def test_a_cancelled_consumer_aborts_its_request(engine: AsyncEngine) -> None:
    gate = StepGate(engine.engine)

    async def cancel_midway() -> None:
        gate.pause_after(1)
        params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        task = asyncio.ensure_future(run_all(engine, "def add(a, b):", params, "cancelled"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())
    assert engine.num_inflight_seqs == 0
    gate.resume()
    wait_until(lambda: not engine.call(lambda e: e.has_unfinished_requests()).result(5), what="the abort")
    engine.check_integrity()


def test_an_engine_error_fails_in_flight_requests_instead_of_hanging(engine: AsyncEngine) -> None:
    def broken_step() -> list:
        raise RuntimeError("boom")

    engine.engine.step = broken_step  # type: ignore[method-assign]
    with pytest.raises(EngineDeadError, match="boom"):
        asyncio.run(asyncio.wait_for(run_all(engine, "class Point:", GREEDY, "x"), timeout=10))
    assert not engine.is_alive
    with pytest.raises(EngineDeadError):
        asyncio.run(run_all(engine, "class Point:", GREEDY, "y"))


def test_shutdown_fails_in_flight_requests(engine: AsyncEngine) -> None:
    gate = StepGate(engine.engine)

    async def shut_down_midway() -> None:
        gate.pause_after(1)
        params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        task = asyncio.ensure_future(run_all(engine, "def add(a, b):", params, "z"))
        await asyncio.sleep(0.1)
        shutdown = asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        while engine.is_alive:  # stopping: the held step may now finish, the loop must not take another
            await asyncio.sleep(0.01)
        gate.resume()
        await shutdown
        with pytest.raises(EngineDeadError, match="shutting down"):
            await asyncio.wait_for(task, timeout=10)

    asyncio.run(shut_down_midway())


def test_the_idle_loop_sleeps(engine: AsyncEngine) -> None:
    calls = []
    original = engine.engine.has_unfinished_requests
    engine.engine.has_unfinished_requests = lambda: calls.append(1) or original()  # type: ignore[method-assign]
    time.sleep(0.3)
    assert len(calls) <= 2  # woken by nothing: it waits on its Event, never spins
    asyncio.run(run_all(engine, "class Point:", GREEDY, "wake"))
    assert len(calls) >= 10

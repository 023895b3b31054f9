"""A real uvicorn server on 127.0.0.1 (free port, background thread) over an AsyncEngine, plus helpers."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from lamina.bench.soak_stats import scrape  # noqa: F401 - the tests read /metrics through it
from lamina.engine.async_engine import AsyncEngine
from lamina.engine.engine import LLMEngine
from lamina.llm import LLM
from lamina.server.app import build_app
from lamina.server.settings import ServerSettings

MODEL_NAME = "tiny-llama"
ENGINE_KWARGS = dict(block_size=4, num_kv_blocks=256, max_model_len=128)


class StepGate:
    """Wraps LLMEngine.step so a test can hold the engine loop after a number of steps (deterministic
    overload and disconnect tests): pause_after(k) lets k more steps run, resume() lifts the limit."""

    def __init__(self, engine: LLMEngine) -> None:
        self._step = engine.step
        self._cond = threading.Condition()
        self._budget: int | None = None  # None: unlimited
        engine.step = self.step  # type: ignore[method-assign]

    def step(self) -> list:
        with self._cond:
            if not self._cond.wait_for(lambda: self._budget is None or self._budget > 0, timeout=30):
                raise RuntimeError("StepGate: the test never resumed the engine")
            if self._budget is not None:
                self._budget -= 1
        return self._step()

    def pause_after(self, steps: int) -> None:
        with self._cond:
            self._budget = steps
            self._cond.notify_all()

    def resume(self) -> None:
        self.pause_after(-1)
        with self._cond:
            self._budget = None
            self._cond.notify_all()


@dataclass
class RunningServer:
    url: str
    engine: AsyncEngine
    settings: ServerSettings
    gate: StepGate
    _server: uvicorn.Server
    _thread: threading.Thread

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self.gate.resume()
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self.engine.shutdown()
        assert not self._thread.is_alive(), "uvicorn did not shut down"


def make_engine(model_dir: str, **overrides: object) -> LLMEngine:
    return LLM(model=model_dir, **{**ENGINE_KWARGS, **overrides}).engine


def start_server(llm_engine: LLMEngine, **settings: object) -> RunningServer:
    gate = StepGate(llm_engine)
    engine = AsyncEngine(llm_engine)
    config = ServerSettings(served_model_name=MODEL_NAME, **settings)
    app = build_app(engine, config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn to start")
    return RunningServer(f"http://127.0.0.1:{port}", engine, config, gate, server, thread)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)

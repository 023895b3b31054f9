"""Graceful shutdown of `lamina serve` (issue 10): SIGTERM stops admission (503), drains what is in flight up
to --shutdown-timeout, ends what is left with an error event, and the process exits 0."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from lamina.server.settings import ServerSettings
from tests.server.harness import scrape, wait_until
from tests.server.test_cli import parse

PROMPT = "def add(a, b):"


@dataclass
class Stream:
    """A streamed completion read on a thread: its SSE payloads, in order."""

    url: str
    max_tokens: int
    events: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> Stream:
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        wait_until(lambda: len(self.events) > 0, timeout=30, what="the first streamed chunk")
        return self

    def _read(self) -> None:
        body = {"prompt": PROMPT, "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[len("data: "):])

    def join(self) -> list[str]:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the stream never ended"
        return self.events


@contextmanager
def serve(*flags: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m lamina.cli serve` on the demo model, on a free port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "lamina.cli", "serve", "--port", str(port), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or _healthy(url), timeout=90, what="lamina serve to start")
        assert proc.poll() is None, proc.stdout.read()
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _refused_after_sigterm(url: str) -> None:
    response = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, timeout=10)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "server_shutting_down" and "shutting down" in error["message"]
    assert httpx.get(url + "/health", timeout=10).status_code == 503  # load balancers stop routing here


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0() -> None:
    with serve("--shutdown-timeout", "60") as (url, proc):
        results: dict[str, httpx.Response] = {}
        plain = threading.Thread(target=lambda: results.setdefault("plain", httpx.post(
            url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True}, timeout=60)))
        plain.start()
        wait_until(lambda: scrape(url).get("lamina:num_requests_running", 0) >= 1, timeout=30,
                   what="the plain request to run")
        stream = Stream(url, max_tokens=48).start()
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        time.sleep(0.2)
        _refused_after_sigterm(url)
        events = stream.join()
        plain.join(timeout=60)
        output = proc.communicate(timeout=60)[0]
        elapsed = time.monotonic() - signalled
    assert proc.returncode == 0, output
    assert elapsed < 60, output
    assert results["plain"].status_code == 200 and results["plain"].json()["usage"]["completion_tokens"] == 40
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("error" in c for c in chunks)
    assert "draining 2 in flight" in output and "drained" in output


def test_a_stream_cut_by_the_shutdown_timeout_ends_with_an_error_event() -> None:
    with serve("--shutdown-timeout", "0.5") as (url, proc):
        stream = Stream(url, max_tokens=1000).start()  # far more than the demo model makes in 0.5 s on a CPU
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        _refused_after_sigterm(url)
        events = stream.join()
        output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "shutting down" in error["message"]
    assert "shutdown timeout" in output


def test_shutdown_timeout_flag() -> None:
    from lamina.server.cli import settings_from_args

    assert settings_from_args(parse()).shutdown_timeout == 30.0
    assert settings_from_args(parse("--shutdown-timeout", "2.5")).shutdown_timeout == 2.5
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="shutdown_timeout"):
            ServerSettings(served_model_name="m", shutdown_timeout=bad)

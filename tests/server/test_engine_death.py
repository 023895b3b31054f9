"""A dead engine (device lost) must not leave a live process that answers 503 forever (issue 10): the
in-flight request fails with an error, and `lamina serve` exits non-zero so a supervisor restarts it."""
from __future__ import annotations

import socket
import subprocess
import sys

import httpx

from tests.server.harness import wait_until

# The demo-model server, with every engine step after the first few raising a device-lost CUDA error.
SERVE_WITH_A_DYING_DEVICE = """
import sys
from lamina.engine.engine import LLMEngine
from lamina.cli import main

step, calls = LLMEngine.step, [0]
def dying_step(self):
    calls[0] += 1
    if calls[0] > 3:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
    return step(self)
LLMEngine.step = dying_step  # this process only
sys.exit(main(sys.argv[1:]))
"""


def test_server_exits_non_zero_when_the_engine_dies() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", SERVE_WITH_A_DYING_DEVICE, "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, proc.stderr.read()
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False
        wait_until(healthy, timeout=120, what="the server to start")
        body = {"model": "demo-model", "prompt": "def add(a, b):", "max_tokens": 32, "ignore_eos": True}
        response = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert response.status_code >= 500 and "error" in response.json()  # failed, not hung or truncated
        assert proc.wait(timeout=60) == 1
        assert "the engine died" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

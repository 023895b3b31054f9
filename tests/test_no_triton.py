"""A fresh CPU machine has no triton (the CPU torch wheel brings none): the README's commands must run
without it. Each command runs in a subprocess in which `import triton` fails."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

NO_TRITON = ("import sys; sys.modules['triton'] = None; "
             "from lamina.cli import main; sys.exit(main(sys.argv[1:]))")


def _lamina(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TRITON, *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def test_generate_runs_without_triton() -> None:
    done = _lamina("generate", "def fibonacci(n):", "--max-tokens", "8", "--temperature", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "generate printed no text"
    assert "triton" not in done.stderr.lower()


def test_chat_runs_without_triton() -> None:
    done = _lamina("chat", "--max-tokens", "8", "--temperature", "0", stdin="write a hello world\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "chat printed no reply"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def _wait_healthy(url: str, server: subprocess.Popen, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert server.poll() is None, f"the server exited: {server.communicate()[1]}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("the server did not become healthy in time")


def test_serve_runs_without_triton() -> None:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", NO_TRITON, "serve", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, server, deadline_s=120)
        models = json.load(urllib.request.urlopen(url + "/v1/models", timeout=10))["data"]
        body = {"model": models[0]["id"], "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
        completion = _post(url + "/v1/completions", body)
        assert completion["choices"][0]["text"]
    finally:
        server.terminate()
        server.wait(timeout=30)

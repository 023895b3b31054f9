"""`lamina serve`: the subcommand's flags, and the real command serving until interrupted."""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lamina import DEMO_MODEL
from lamina.cli import main
from lamina.server.cli import register, resolve_model, settings_from_args
from tests.server.harness import wait_until

SERVING_MD = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_serve_flags_and_defaults() -> None:
    args = parse()
    assert (resolve_model(args), args.host, args.port, args.api_key) == (DEMO_MODEL, "127.0.0.1", 8000, None)
    settings = settings_from_args(args)
    assert settings.served_model_name == os.path.basename(DEMO_MODEL) and settings.max_queue == 1024
    args = parse("--model", "/m/qwen/", "--served-model-name", "q", "--max-queue", "-1", "--max-n", "2",
                 "--block-size", "8", "--api-key", "k")
    settings = settings_from_args(args)
    assert (settings.served_model_name, settings.max_queue, settings.max_n, settings.api_key) == ("q", None, 2, "k")
    assert args.block_size == 8
    assert settings_from_args(parse("--model", "/m/qwen/")).served_model_name == "qwen"
    with pytest.raises(ValueError, match="max_n"):
        settings_from_args(parse("--max-n", "0"))


def test_model_positional_as_in_vllm_serve() -> None:
    assert resolve_model(parse("/m/qwen")) == "/m/qwen" == resolve_model(parse("--model", "/m/qwen"))
    assert settings_from_args(parse("/m/qwen/", "--port", "9000")).served_model_name == "qwen"
    assert resolve_model(parse("/m/qwen", "--model", "/m/qwen/")) == "/m/qwen"  # the same directory twice
    with pytest.raises(ValueError, match="given twice"):
        resolve_model(parse("/m/qwen", "--model", "/m/llama"))


def test_a_busy_port_fails_before_the_model_loads(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # The model does not exist: had it been loaded first, the error would name it, not the port.
        assert main(["serve", "/no/such/model", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port: cannot listen on 127.0.0.1:{port}" in err and "model" not in err.split("--port")[0]


def test_the_docs_client_snippet_names_the_default_served_model() -> None:
    names = set(re.findall(r'model="([^"]+)"', SERVING_MD.read_text()))
    assert names == {settings_from_args(parse()).served_model_name}  # a 404 otherwise


def test_lamina_serve_model_runs_logs_a_summary_and_stops_on_sigint(model_dir: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = ["serve", model_dir, "--port", str(port), "--max-model-len", "64", "--num-kv-blocks", "64",
            "--uvicorn-log-level", "warning"]  # the model positional, as `vllm serve MODEL`; default log level
    proc = subprocess.Popen([sys.executable, "-m", "lamina.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or _healthy(url), timeout=60, what="lamina serve to start")
        assert proc.poll() is None, proc.stdout.read()
        name = os.path.basename(model_dir)
        r = httpx.post(url + "/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output
    [summary] = [line for line in output.splitlines() if line.startswith("INFO lamina.server.cli: model ")]
    for part in (f"model {name} ", "float32 on cpu", "max_model_len 64", "KV cache 1,008 tokens (64 blocks of 16)",
                 "max_num_seqs ", "prefix caching on"):
        assert part in summary, summary
    assert f"serving {name} on http://127.0.0.1:{port}" in output


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False

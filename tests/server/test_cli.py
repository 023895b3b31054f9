"""`lamina serve`: the subcommand's flags, and the real command serving until interrupted."""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from lamina import DEMO_MODEL
from lamina.server.cli import register, settings_from_args
from tests.server.harness import wait_until

# The lead wires register() into lamina/cli.py; this runs the same subcommand on its own parser.
LAUNCHER = ("import argparse, sys; from lamina.server.cli import register; p = argparse.ArgumentParser(); "
            "register(p.add_subparsers()); a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_serve_flags_and_defaults() -> None:
    args = parse()
    assert (args.model, args.host, args.port, args.api_key) == (DEMO_MODEL, "127.0.0.1", 8000, None)
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


def test_lamina_serve_runs_and_stops_on_sigint(model_dir: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = ["serve", "--model", model_dir, "--port", str(port), "--max-model-len", "64", "--num-kv-blocks", "64",
            "--uvicorn-log-level", "warning"]
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, *argv], stdout=subprocess.PIPE,
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


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False

"""`lamina serve [MODEL]`: the OpenAI-compatible HTTP server.

Wired into the `lamina` command with:

    from lamina.server.cli import register as register_serve
    register_serve(subparsers)

The port is bound before the model loads (a busy port fails at once, not minutes later) and the bound
socket is handed to uvicorn.
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable

from lamina import DEMO_MODEL
from lamina.cli_args import add_engine_args, engine_kwargs, engine_summary
from lamina.server.settings import ServerSettings

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve` subcommand."""
    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    parser.add_argument("model_tag", nargs="?", metavar="MODEL",
                        help="a local HF model directory, as in `vllm serve MODEL` (or --model; default: the demo "
                             "model)")
    parser.add_argument("--model", default=None, help="a local HF model directory (default: the demo model)")
    add_engine_args(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    server.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    server.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer <key>' on /v1/* (/health and /metrics stay open)")
    server.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: the model directory's name)")
    server.add_argument("--max-queue", type=int, default=1024,
                        help="refuse requests with 429 beyond this many waiting (default: 1024; -1 = no limit)")
    server.add_argument("--max-n", type=int, default=16, help="the most parallel samples per request (default: 16)")
    server.add_argument("--max-body-bytes", type=int, default=4 << 20,
                        help="refuse larger request bodies with 413 (default: 4 MiB)")
    server.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="on SIGTERM / Ctrl-C: refuse new requests (503) and wait up to this many seconds for "
                             "those in flight; what is still running then ends with an error (default: 30)")
    server.add_argument("--uvicorn-log-level", default="info", help="uvicorn's log level (default: info)")
    parser.set_defaults(func=run)


def resolve_model(args: argparse.Namespace) -> str:
    """The model directory: the positional MODEL or --model (the same one if both are given), else the demo."""
    tag, flag = args.model_tag, args.model
    if tag and flag and os.path.normpath(tag) != os.path.normpath(flag):
        raise ValueError(f"model: given twice, as MODEL {tag!r} and --model {flag!r}; give one")
    return tag or flag or DEMO_MODEL


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    model = resolve_model(args)
    name = args.served_model_name or os.path.basename(os.path.normpath(model))
    return ServerSettings(served_model_name=name, host=args.host, port=args.port, api_key=args.api_key,
                          max_queue=None if args.max_queue == -1 else args.max_queue, max_n=args.max_n,
                          max_body_bytes=args.max_body_bytes, model_root=model,
                          shutdown_timeout=args.shutdown_timeout)


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (uvicorn listens on it); a ValueError naming the flag when it cannot be."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise ValueError(f"--host: cannot resolve {host!r} ({err.strerror})") from err
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no obstacle
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise ValueError(f"--port: cannot listen on {host}:{port} ({err.strerror}); another server may be "
                         "running there: stop it or pick another --port") from err
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    """Bind the port, load the model, start the engine thread and serve until a signal (then drain)."""
    from lamina.engine.async_engine import AsyncEngine
    from lamina.llm import LLM
    from lamina.server.app import build_app

    settings = settings_from_args(args)  # validate the server flags before loading the model
    sock = bind_socket(settings.host, settings.port)
    try:
        llm_engine = LLM(model=settings.model_root, usage="serve", **engine_kwargs(args)).engine
        logger.info("%s", engine_summary(llm_engine))
        if llm_engine.tokenizer is not None:
            _ = llm_engine.tokenizer.max_bytes_per_token  # computed once now, not in the first long request
        died = threading.Event()
        engine = AsyncEngine(llm_engine, on_dead=lambda _err: died.set())
        try:
            _serve(build_app(engine, settings), settings, sock, args.uvicorn_log_level, engine.shutdown, died)
        finally:
            engine.shutdown()
    finally:
        sock.close()
    if died.is_set():
        print("lamina serve: error: the engine died (see the log above); exiting so that a supervisor can "
              "restart the server", file=sys.stderr)
        return 1
    return 0


def _serve(app: object, settings: ServerSettings, sock: socket.socket, log_level: str,
           stop_engine: Callable[[], None], engine_died: threading.Event) -> None:
    """Run uvicorn until SIGTERM / SIGINT, then drain gracefully (lamina.server.shutdown)."""
    import uvicorn

    from lamina.server.shutdown import DrainingServer, ShutdownGate

    host, port = settings.host, sock.getsockname()[1]
    logger.info("serving %s on http://%s:%d", settings.served_model_name, host, port)
    gate = ShutdownGate(app)
    # The drain has already waited for the requests: uvicorn's own grace period only closes connections.
    config = uvicorn.Config(gate, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    server = DrainingServer(config, gate, settings.shutdown_timeout, stop_engine, engine_died)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises a signal it handled itself (a forced exit)
        pass

"""`lamina serve`: the OpenAI-compatible HTTP server.

Wired into the `lamina` command with:

    from lamina.server.cli import register as register_serve
    register_serve(subparsers)
"""
from __future__ import annotations

import argparse
import logging
import os

from lamina import DEMO_MODEL
from lamina.cli_args import add_engine_args, engine_kwargs
from lamina.server.settings import ServerSettings

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve` subcommand."""
    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    parser.add_argument("--model", default=DEMO_MODEL, help="a local HF model directory (default: the demo model)")
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
    server.add_argument("--uvicorn-log-level", default="info", help="uvicorn's log level (default: info)")
    parser.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    return ServerSettings(served_model_name=name, host=args.host, port=args.port, api_key=args.api_key,
                          max_queue=None if args.max_queue == -1 else args.max_queue, max_n=args.max_n,
                          max_body_bytes=args.max_body_bytes, model_root=args.model)


def run(args: argparse.Namespace) -> int:
    """Load the model, start the engine thread and serve until interrupted."""
    import uvicorn

    from lamina.engine.async_engine import AsyncEngine
    from lamina.llm import LLM
    from lamina.server.app import build_app

    settings = settings_from_args(args)  # validate the server flags before loading the model
    engine = AsyncEngine(LLM(model=args.model, **engine_kwargs(args)).engine)
    try:
        app = build_app(engine, settings)
        logger.info("serving %s on http://%s:%d", settings.served_model_name, settings.host, settings.port)
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.uvicorn_log_level,
                    timeout_graceful_shutdown=5)
    finally:
        engine.shutdown()
    return 0

"""Graceful shutdown: SIGTERM (or Ctrl-C) stops admission, drains in-flight requests, then the server exits.

    signal -> ShutdownGate closes: new requests get 503 (code "server_shutting_down"), /health 503
           -> wait until no request is in flight, at most shutdown_timeout seconds
           -> past the timeout: the engine is shut down, so what is still running ends with an error
              (a stream with an error event, then [DONE]; a plain request with a 503 body), never silently
           -> uvicorn closes the sockets and `lamina serve` exits 0

A second signal during the drain stops at once (uvicorn's forced exit). A dead engine (`engine_died` set
by AsyncEngine's on_dead, after it failed every in-flight request) stops the server at once too, and
`lamina serve` then exits non-zero, so a supervisor restarts it (vLLM's behaviour).
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from lamina.server import errors

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_FLUSH_S = 5.0  # after the timeout: how long failed requests get to send their error to the client


def shutting_down() -> errors.APIError:
    return errors.APIError(503, "The server is shutting down and accepts no new requests; retry on another "
                           "instance.", type="server_error", code="server_shutting_down")


class ShutdownGate:
    """ASGI wrapper: counts HTTP requests in flight (until their response is fully sent, streams included) and,
    once closed, answers new ones 503 with an OpenAI error body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.closed = False
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.closed:
            await shutting_down().response({"Connection": "close"})(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def wait_idle(self, timeout: float) -> bool:
        """True once nothing is in flight; False if something still is after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        return not self.in_flight


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM / SIGINT drains (see the module docstring) instead of cutting."""

    def __init__(self, config: uvicorn.Config, gate: ShutdownGate, timeout: float,
                 stop_engine: Callable[[], None], engine_died: threading.Event | None = None) -> None:
        super().__init__(config)
        self.gate = gate
        self.timeout = timeout
        self.stop_engine = stop_engine
        self.engine_died = engine_died
        self.drain_requested = False
        self._drain: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_requested:  # a second signal: stop now
            logger.warning("%s again: stopping without waiting", signal.Signals(sig).name)
            self.should_exit = self.force_exit = True
            return
        self.drain_requested = True  # on_tick starts the drain on the event loop

    async def on_tick(self, counter: int) -> bool:
        if self.engine_died is not None and self.engine_died.is_set() and not self.should_exit:
            logger.error("the engine died: stopping the server (its requests have failed)")
            self.gate.closed = self.should_exit = True
        if self.drain_requested and self._drain is None:
            self._drain = asyncio.ensure_future(self.drain())
        return await super().on_tick(counter)

    async def drain(self) -> None:
        self.gate.closed = True
        logger.info("shutting down: refusing new requests, draining %d in flight (up to %g s)",
                    self.gate.in_flight, self.timeout)
        if not await self.gate.wait_idle(self.timeout):
            logger.warning("shutdown timeout (%g s): failing the %d requests still in flight", self.timeout,
                           self.gate.in_flight)
            await asyncio.to_thread(self.stop_engine)
            await self.gate.wait_idle(_FLUSH_S)
        logger.info("drained; stopping the server")
        self.should_exit = True

"""A tiny OpenAI-compatible streaming server for the bench tests: known chunk counts, known delays.

FastAPI + uvicorn on 127.0.0.1 on a free port, in a background thread. It streams `max_tokens` tokens
(`tokens_per_chunk` a chunk) after `ttft_s`, `itl_s` apart, honours `stream_options.include_usage` when
`honour_usage`, fails every `fail_every`-th request with the next status of `fail_statuses`, and records
what it received and how many requests were in flight at once.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MODEL = "stub-model"


@dataclass
class StubConfig:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    tokens_per_chunk: int = 1
    honour_usage: bool = True
    finish_chunk: bool = True
    fail_every: int = 0
    fail_statuses: tuple[int, ...] = (400, 429, 500)


@dataclass
class StubState:
    bodies: list[dict] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def _chunk(text: str, finish_reason: str | None = None) -> str:
    body = {"id": "cmpl-stub", "object": "text_completion", "model": MODEL,
            "choices": [{"index": 0, "text": text, "finish_reason": finish_reason}]}
    return f"data: {json.dumps(body)}\n\n"


def make_app(cfg: StubConfig, state: StubState) -> FastAPI:
    app = FastAPI()
    statuses = itertools.cycle(cfg.fail_statuses)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> object:
        body = await request.json()
        state.bodies.append(body)
        state.headers.append(dict(request.headers))
        state.arrivals.append(time.perf_counter())
        if cfg.fail_every and len(state.bodies) % cfg.fail_every == 0:
            status = next(statuses)
            return JSONResponse({"error": {"message": f"stub failure {status}", "code": status}}, status)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        return StreamingResponse(_stream(cfg, state, body), media_type="text/event-stream")

    return app


async def _stream(cfg: StubConfig, state: StubState, body: dict) -> AsyncIterator[str]:
    try:
        n = int(body["max_tokens"])
        await asyncio.sleep(cfg.ttft_s)
        sent = 0
        while sent < n:
            k = min(cfg.tokens_per_chunk, n - sent)
            if sent:
                await asyncio.sleep(cfg.itl_s)
            sent += k
            last = sent == n and not cfg.finish_chunk
            yield _chunk("tok " * k, "length" if last else None)
        if cfg.finish_chunk:
            yield _chunk("", "length")
        if cfg.honour_usage and (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                     "total_tokens": len(body["prompt"]) + n}
            yield f"data: {json.dumps({'id': 'cmpl-stub', 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        state.in_flight -= 1


class StubServer:
    """`with StubServer(StubConfig(...)) as stub: stub.base_url ...`"""

    def __init__(self, cfg: StubConfig | None = None) -> None:
        self.cfg = cfg or StubConfig()
        self.state = StubState()
        config = uvicorn.Config(make_app(self.cfg, self.state), host="127.0.0.1", port=0,
                                log_level="warning", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("stub server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

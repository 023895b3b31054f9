"""The FastAPI app: OpenAI-compatible routes over one AsyncEngine.

    POST /v1/completions, POST /v1/chat/completions   (stream: true -> server-sent events, then [DONE])
    GET  /v1/models, GET /health, GET /metrics

Bodies are read and parsed by body.py, not by FastAPI, so that an oversized body (413), malformed JSON and a
wrongly typed field all come back as OpenAI error bodies naming the field. With an api_key, /v1/* needs
"Authorization: Bearer <key>" (compared in constant time); /health and /metrics stay open, as in vLLM.
"""
from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as HTTPRequest

from lamina.engine.async_engine import AsyncEngine
from lamina.server import errors
from lamina.server.body import parse_body
from lamina.server.chat import create_chat_completion
from lamina.server.completions import create_completion
from lamina.server.metrics import ServerMetrics
from lamina.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList, dump
from lamina.server.serving import OpenAIServing
from lamina.server.settings import ServerSettings

logger = logging.getLogger(__name__)



def build_app(engine: AsyncEngine, settings: ServerSettings) -> FastAPI:
    """The server app. It installs its metrics as `engine.on_finished`; the caller owns (and shuts down) the
    engine."""
    app = FastAPI(title="lamina", summary="OpenAI-compatible LLM server", docs_url=None, redoc_url=None)
    metrics = ServerMetrics(engine.get_stats, settings.served_model_name)
    engine.on_finished = metrics.observe_finished
    serving = OpenAIServing(engine, settings)
    app.state.engine, app.state.settings, app.state.metrics = engine, settings, metrics
    _add_error_handlers(app)
    app.include_router(_v1_router(serving, settings, engine))

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_alive:
            return errors.engine_dead("the engine loop stopped").response()
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _v1_router(serving: OpenAIServing, settings: ServerSettings, engine: AsyncEngine) -> APIRouter:
    router = APIRouter(prefix="/v1", dependencies=[Depends(_api_key_check(settings.api_key))])
    limit = settings.max_body_bytes

    @router.post("/completions")
    async def completions(request: HTTPRequest) -> Response:
        body = await parse_body(request, CompletionRequest, limit)
        return await create_completion(serving, body, request)

    @router.post("/chat/completions")
    async def chat_completions(request: HTTPRequest) -> Response:
        body = await parse_body(request, ChatCompletionRequest, limit)
        return await create_chat_completion(serving, body, request)

    @router.get("/models")
    async def models() -> JSONResponse:
        card = ModelCard(id=settings.served_model_name, root=settings.model_root, max_model_len=engine.max_model_len,
                         vocab_size=engine.engine.arch.vocab_size)
        return JSONResponse(dump(ModelList(data=[card])))

    return router


def _api_key_check(api_key: str | None) -> Callable[[HTTPRequest], Awaitable[None]]:
    expected = f"Bearer {api_key}".encode() if api_key else None

    async def check(request: HTTPRequest) -> None:
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode("latin-1", errors="replace")
        if not hmac.compare_digest(given, expected):
            raise errors.invalid_api_key()

    return check


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(errors.APIError)
    async def api_error(_: HTTPRequest, err: errors.APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: HTTPRequest, err: RequestValidationError) -> JSONResponse:
        return errors.from_pydantic_errors(list(err.errors())).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: HTTPRequest, err: StarletteHTTPException) -> JSONResponse:
        return errors.APIError(err.status_code, str(err.detail)).response(err.headers)

    @app.exception_handler(Exception)
    async def internal_error(_: HTTPRequest, err: Exception) -> JSONResponse:
        logger.exception("unhandled error in a request handler")
        return errors.APIError(500, f"internal server error: {err!r}", type="server_error").response()

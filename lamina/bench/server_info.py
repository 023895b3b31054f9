"""What `lamina bench serve` learns from the server: the served model and its limits (GET /v1/models), and
what a failed request means (the server's own message, and a hint naming the likely cause).

`max_model_len` is vLLM's field of a /v1/models entry; `vocab_size` is lamina's. Servers that report
neither (HF `transformers serve`, ...) still work: the limits are then unknown and nothing is fitted.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from .datasets import ServerLimits


def api_url(base_url: str, endpoint: str = "/v1/completions") -> str:
    """`http://host:8000` or `http://host:8000/v1` -> `http://host:8000/v1/completions`."""
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"--base-url must start with http:// or https://, got {base_url!r}")
    base = base_url.rstrip("/")
    if base.endswith("/v1") and endpoint.startswith("/v1/"):
        base = base[: -len("/v1")]
    return base + "/" + endpoint.lstrip("/")


@dataclass(frozen=True)
class ServedModel:
    """The model to send, and its limits when GET /v1/models reports them (vLLM and lamina do)."""

    id: str
    limits: ServerLimits


async def served_model(base_url: str, api_key: str | None, model: str | None, ready_timeout_s: float = 0.0,
                       timeout_s: float = 30.0) -> ServedModel:
    """`model`'s entry of GET /v1/models (without `model`: the first entry, what --model defaults to).

    Retries connection failures for up to `ready_timeout_s` while the server starts. Without `model`, a
    failure is an error (give --model); with it, the server's limits are just unknown.
    """
    url = api_url(base_url, "/v1/models")
    try:
        entries = await _get_models(url, api_key, ready_timeout_s, timeout_s)
        entry = next((e for e in entries if e.get("id") == model), None) if model else entries[0]
    except Exception as err:  # noqa: BLE001 - any failure means: ask the user for --model
        if model:
            return ServedModel(model, ServerLimits())
        raise ValueError(f"could not read the model name from {url} ({type(err).__name__}: {err}); is the "
                         "server up at --base-url (--ready-timeout S waits for it)? Or give --model") from err
    if entry is None:
        return ServedModel(model, ServerLimits())
    return ServedModel(model or entry["id"], ServerLimits(_int_or_none(entry.get("max_model_len")),
                                                          _int_or_none(entry.get("vocab_size"))))


async def _get_models(url: str, api_key: str | None, ready_timeout_s: float, timeout_s: float) -> list[dict]:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + ready_timeout_s
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        while True:
            try:
                response = await client.get(url, headers=headers)
                break
            except httpx.TransportError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(1.0)
        response.raise_for_status()
        return list(response.json()["data"])


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def error_message(body: str) -> str:
    """The `message` of an OpenAI error body (`{"error": {"message": ...}}`), else the body itself."""
    try:
        error = json.loads(body).get("error")
    except (json.JSONDecodeError, AttributeError):
        return body
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return error if isinstance(error, str) else body


def warm_up_hint(error: str) -> str:
    """What a failed first request most likely means, from its error (`HTTP 400: ...`, `ConnectError: ...`)."""
    status = int(error[5:8]) if error.startswith("HTTP ") and error[5:8].isdigit() else None
    if status is None:
        if error.startswith(("ConnectError", "ConnectTimeout")):
            return ("no server answered: check --base-url, and that the server is up (--ready-timeout S waits "
                    "for it to start)")
        return "the request did not complete (see the error above)"
    if status in (401, 403):
        return "the server refused the API key: check --api-key (default: $OPENAI_API_KEY)"
    if status == 404:
        return ("the server knows no such model or endpoint: check --model (GET /v1/models lists the served "
                "names) and --endpoint")
    if 400 <= status < 500:
        return ("the server rejected the request for the reason in its message above: check the request options "
                "(--random-input-len, --random-output-len, --random-vocab-size, --extra-body) against the model")
    return "the server failed on the request (see its message above and its log)"

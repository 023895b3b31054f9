"""OpenAI error bodies: {"error": {"message", "type", "param", "code"}}.

Engine validation raises ValueError whose message starts with the field it is about ("temperature must be
...", "prompt_token_ids[3]: ..."); `from_value_error` turns that leading name into the error's `param`.
"""
from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from fastapi.responses import JSONResponse

INVALID_REQUEST = "invalid_request_error"

_LEADING_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)")


class APIError(Exception):
    """An error the client gets as an OpenAI error body with this HTTP status."""

    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None) -> None:
        message, param = _printable(message), None if param is None else _printable(param)
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=dict(headers or {}))


def _printable(text: str) -> str:
    """`text` as valid Unicode: a lone surrogate a client sent (JSON's \\ud800) would make the body (and a log
    line) fail to encode, so it is shown as the escape it came in as."""
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def invalid_api_key() -> APIError:
    return APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                    param=None, code="invalid_api_key")


def queue_full(max_queue: int) -> APIError:
    return APIError(429, f"The server is overloaded: the waiting queue is at its limit of {max_queue} "
                    "requests (--max-queue). Retry later.", type="rate_limit_error", code="rate_limit_exceeded")


def body_too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than the limit of {limit} bytes.",
                    code="request_too_large")


def client_disconnected() -> APIError:
    """The client left before sending its whole body: nothing to answer (the send is dropped), nothing to log."""
    return APIError(499, "the client disconnected before sending the whole request body",
                    code="client_disconnected")


def request_failed(message: str) -> APIError:
    """This request's part of an engine step failed (finish_reason "error"); the engine went on."""
    return APIError(500, f"The request failed in the engine: {message}", type="server_error",
                    code="request_failed")


def engine_dead(message: str) -> APIError:
    return APIError(503, f"The engine is not available: {message}", type="server_error",
                    code="engine_unavailable")


def param_from_message(message: str, fields: Collection[str], aliases: Mapping[str, str]) -> str | None:
    """The request field a validation message is about: its leading name, if it is a known field."""
    match = _LEADING_NAME.match(message)
    if match is None:
        return None
    name = aliases.get(match.group(1), match.group(1))
    return name if name in fields else None


def from_value_error(err: ValueError, fields: Collection[str],
                     aliases: Mapping[str, str] | None = None) -> APIError:
    """A 400 for an engine validation error, `param` set to the field its message names."""
    message = str(err)
    return bad_request(message, param_from_message(message, fields, aliases or {}))


def from_pydantic_errors(errors: list[dict]) -> APIError:
    """A 400 for the first pydantic validation error; `param` is the top-level field it is about."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    where = f"{'.'.join(loc)}: " if loc else ""
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return bad_request(f"{where}{message}", param=loc[0] if loc else None)

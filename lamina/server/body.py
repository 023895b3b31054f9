"""Request bodies: read (bounded), decode (bounded), check the text, validate against a request model.

Every failure is a 4xx with an OpenAI error body and no traceback in the log:

    more than max_body_bytes                    413
    not UTF-8 / not JSON / not an object        400
    a number of more than 4300 digits           400  (Python's int parsing limit)
    nested deeper than the interpreter's        400  (the JSON decoder's recursion guard, ~1,000 levels)
      recursion limit
    a lone UTF-16 surrogate in any string       400  naming the field (the tokenizer and the response
      (key or value; JSON's "\\ud800" escape)         encoder both fail on it)
    a guided_* field, an UNSUPPORTED one set    400  naming the field
    a wrong type or shape                       400  naming the field (pydantic, strict)
    the client leaving mid-body                 499  (nothing is sent; nothing is logged)
"""
from __future__ import annotations

import json
import logging
import re
import sys
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest

from lamina.sampling_params import first_invalid_char, valid_text
from lamina.server import errors
from lamina.server.unsupported import UNSUPPORTED_PREFIX, unsupported_message

logger = logging.getLogger(__name__)

Model = TypeVar("Model", bound=BaseModel)
DRAIN_FACTOR = 16  # an oversized body is read (and dropped) up to this many limits, then the socket closes
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_MAX_LOGGED_NAMES = 256  # ignored field names logged once each, up to this many (a client may send endless ones)
_logged_names: set[str] = set()


async def read_limited(request: HTTPRequest, limit: int) -> bytes:
    """The body, or 413 when it is longer than `limit` bytes (499 when the client leaves half-way)."""
    declared = request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            too_large = too_large or size > limit
            if size > limit * DRAIN_FACTOR:
                break  # stop reading: the connection closes with the 413
            if not too_large:
                chunks.append(chunk)
    except ClientDisconnect:
        raise errors.client_disconnected() from None
    if too_large:
        raise errors.body_too_large(limit)
    return b"".join(chunks)


def decode_json(raw: bytes) -> dict:
    """The body as a JSON object; 400 for anything else, including what json.loads refuses to build."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise errors.bad_request("the request body is nested too deeply (the limit is about "
                                 f"{sys.getrecursionlimit()} levels)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise errors.bad_request(f"the request body is not valid JSON: {err}") from None
    except ValueError:  # int(): "Exceeds the limit (4300 digits) for integer string conversion"
        raise errors.bad_request("the request body holds a number with more than "
                                 f"{sys.get_int_max_str_digits()} digits") from None
    if not isinstance(data, dict):
        raise errors.bad_request(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def check_text(raw: bytes, data: dict) -> None:
    """400 naming the field when any string of the body holds a lone surrogate (only JSON's \\uD8xx-\\uDFxx
    escapes can put one there, so a body without them is not walked)."""
    if _SURROGATE_ESCAPE.search(raw) is None:
        return
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str) and not valid_text(value):
            field = path or "the request body"
            raise errors.bad_request(f"{field}: must be valid Unicode text, got {first_invalid_char(value)}",
                                     param=path.split(".")[0].split("[")[0] or None)
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((f"{path}.{key}" if path else key, key))
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))


def check_unknown_fields(model: type[BaseModel], data: dict) -> None:
    """Unknown top-level fields: a guided_* one (guided decoding, not implemented) is a 400 naming it; the
    others are ignored, each name logged once (vLLM's behaviour: clients send `user`, `metadata`, ...)."""
    for name in data:
        if name in model.model_fields:
            continue
        if name.startswith(UNSUPPORTED_PREFIX) and data[name] is not None:
            raise errors.bad_request(f"{name}: {unsupported_message(name)}", param=name)
        if name not in _logged_names and len(_logged_names) < _MAX_LOGGED_NAMES:
            _logged_names.add(name)
            logger.info("ignoring the unknown request field %s (not an OpenAI or lamina parameter)",
                        ascii(name)[:100])


async def parse_body(request: HTTPRequest, model: type[Model], limit: int) -> Model:
    """Read, decode, check and validate a JSON body; every failure is a 4xx naming the field."""
    raw = await read_limited(request, limit)
    data = decode_json(raw)
    check_text(raw, data)
    check_unknown_fields(model, data)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise errors.from_pydantic_errors(err.errors(include_url=False)) from None

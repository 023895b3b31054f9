"""RequestStream: one request's outputs, from the engine thread to the event loop that awaits them."""
from __future__ import annotations

import asyncio
from typing import Protocol

from lamina.outputs import RequestOutput

__all__ = ["EngineDeadError", "RequestFailedError", "RequestStream", "StreamOwner"]


class StreamOwner(Protocol):
    """What a stream needs of its engine (lamina.engine.async_engine.AsyncEngine)."""

    def abort(self, request_id: str) -> None: ...

    def release(self, stream: RequestStream) -> None: ...


class EngineDeadError(RuntimeError):
    """The engine loop stopped (the engine broke: lamina/failures.py, or shutdown()); the request cannot
    complete."""


class RequestFailedError(RuntimeError):
    """This request's part of an engine step raised (finish_reason "error"); the engine goes on."""


class RequestStream:
    """Async iterator over one request's RequestOutputs (in its output_kind); ends after the finished one.

    close() aborts the request if it has not finished (a client that went away).
    """

    def __init__(self, request_id: str, owner: StreamOwner, num_seqs: int) -> None:
        self.request_id = request_id
        self.num_seqs = num_seqs
        self._owner = owner
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._done = False

    def put(self, item: RequestOutput | BaseException) -> None:
        """Hand an output or an error to the consumer (called from the engine thread)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._finish()
            raise item
        if item.finished:
            self._finish()
        return item

    @property
    def finished(self) -> bool:
        return self._done

    def close(self) -> None:
        """Abort the request unless it already finished; safe to call more than once."""
        if not self._done:
            self._finish()
            self._owner.abort(self.request_id)

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._owner.release(self)

"""AsyncEngine: the LLMEngine driven by one background thread, consumed from asyncio.

    asyncio side (server handlers)              engine thread (owns the LLMEngine)
    ------------------------------              ----------------------------------
    process(): tokenize + validate (no state)
    submit() --- _Add ---> command queue ---->  drain commands between steps
    RequestStream.close() -- _Abort -->          engine.step() -> RequestOutputs
    RequestStream.__anext__ <-- asyncio.Queue <- loop.call_soon_threadsafe(put)

The LLMEngine is not thread-safe: only the engine thread touches it. The thread sleeps on an Event while
there is nothing to do (never busy-spins). A request whose step failed (finish_reason "error") ends its
stream with RequestFailedError; the others go on. If the engine itself breaks (EngineBrokenError: device
lost, steps failing in a row), every in-flight request fails with EngineDeadError, later submissions are
refused, and `on_dead` is called (a server exits non-zero there), so no client hangs on a dead engine.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from lamina.engine.engine import LLMEngine
from lamina.engine.input_processor import PromptType
from lamina.engine.request import Request
from lamina.engine.request_stream import EngineDeadError, RequestFailedError, RequestStream
from lamina.engine.stats import SchedulerStats
from lamina.loader.tokenizer import Tokenizer
from lamina.outputs import RequestOutput
from lamina.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Called on the engine thread with the whole final output of every request (finished or aborted), any kind.
FinishedHook = Callable[[RequestOutput], None]
# Called on the engine thread once the loop has died of an error, after every in-flight request failed.
DeadHook = Callable[[BaseException], None]


@dataclasses.dataclass
class _Add:
    request_id: str
    requests: list[Request]
    stream: RequestStream


@dataclasses.dataclass
class _Abort:
    request_id: str


@dataclasses.dataclass
class _Call:
    fn: Callable[[LLMEngine], Any]
    future: concurrent.futures.Future


class AsyncEngine:
    """Own an LLMEngine and run its step loop in a background thread (started on construction)."""

    def __init__(self, engine: LLMEngine, on_finished: FinishedHook | None = None,
                 on_dead: DeadHook | None = None) -> None:
        self.engine = engine
        self.max_model_len = engine.max_model_len
        self.max_num_seqs = engine.config.scheduler_config.max_num_seqs
        self.on_finished = on_finished
        self.on_dead = on_dead
        self._commands: queue.SimpleQueue[_Add | _Abort | _Call] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()  # a command is either run by the loop or failed by _fail_all
        self._closed = False
        self._dead: BaseException | None = None
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._stats = engine.get_stats().snapshot()
        self._num_inflight_seqs = 0  # event-loop side: sequences submitted and not yet finished
        # Called as requests finish by the output processor: only it can build a DELTA request's whole output.
        engine.output_processor.on_finished = self._notify_finished
        self._thread = threading.Thread(target=self._run, name="lamina-engine", daemon=True)
        self._thread.start()

    # ---- asyncio side -------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    @property
    def num_inflight_seqs(self) -> int:
        """Sequences (n per request) submitted and not yet finished or aborted."""
        return self._num_inflight_seqs

    def queued_seqs_after(self, num_seqs: int) -> int:
        """Sequences that could not be scheduled for lack of sequence slots or KV blocks if `num_seqs`
        more were submitted now: those beyond max_num_seqs, or, while the KV cache holds waiting requests
        back (SchedulerStats.kv_limited), beyond the running ones. Exact in what this side submitted
        (a hard bound for admission); the engine's side is its latest snapshot."""
        stats = self._stats
        capacity = min(stats.num_running, self.max_num_seqs) if stats.kv_limited else self.max_num_seqs
        return max(0, self._num_inflight_seqs + num_seqs - capacity)

    @property
    def is_alive(self) -> bool:
        return self._dead is None and not self._stopping

    def process(self, prompt: PromptType, params: SamplingParams | None, request_id: str) -> list[Request]:
        """Tokenize and validate; raises ValueError naming the field. Queues nothing."""
        return self.engine.process_inputs(prompt, params, request_id)

    def submit(self, request_id: str, requests: list[Request]) -> RequestStream:
        """Queue requests made by process() and return the stream of their outputs (call on the event loop)."""
        stream = RequestStream(request_id, self, len(requests))
        self._send(_Add(request_id, requests, stream))
        self._num_inflight_seqs += stream.num_seqs
        return stream

    async def generate(self, prompt: PromptType, params: SamplingParams | None,
                       request_id: str) -> AsyncIterator[RequestOutput]:
        """Yield RequestOutputs, in the kind params.output_kind asks for, until the request finishes.

        Validation errors raise ValueError before anything is queued; if the consumer stops early
        (cancelled, closed: a client disconnect) the request is aborted and its KV blocks freed.
        """
        stream = self.submit(request_id, self.process(prompt, params, request_id))
        try:
            async for output in stream:
                yield output
        finally:
            stream.close()

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks (no-op if it already finished)."""
        self._send(_Abort(request_id))

    def get_stats(self) -> SchedulerStats:
        """A snapshot taken by the engine thread after its latest step (safe from any thread)."""
        return self._stats

    def call(self, fn: Callable[[LLMEngine], Any]) -> concurrent.futures.Future:
        """Run fn(engine) on the engine thread between steps; the future holds its result."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._send(_Call(fn, future))
        return future

    def check_integrity(self, timeout: float = 10.0) -> None:
        """Assert the KV block accounting is exact, checked on the engine thread."""
        self.call(lambda engine: engine.check_integrity()).result(timeout)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop thread; in-flight requests fail with EngineDeadError."""
        self._stopping = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _death(self) -> EngineDeadError:
        if self._dead is not None:
            return EngineDeadError(f"the engine stopped after an error: {self._dead!r}")
        return EngineDeadError("the engine is shutting down")

    def _send(self, command: _Add | _Abort | _Call) -> None:
        with self._lock:
            if self._closed and not isinstance(command, _Abort):
                raise self._death()
            self._commands.put(command)
        self._wake.set()

    def release(self, stream: RequestStream) -> None:
        """A stream ended (finished, failed or closed): its sequences no longer count as in flight."""
        self._num_inflight_seqs -= stream.num_seqs

    # ---- engine thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wake.clear()  # before draining: a command sent after this sets it again
                self._drain_commands()
                if not self.engine.has_unfinished_requests():
                    self._snapshot_stats()
                    self._wake.wait()
                    continue
                self._dispatch(self.engine.step())
                self._snapshot_stats()
        except BaseException as err:  # noqa: BLE001 - any failure must reach the waiting clients
            logger.exception("engine loop failed; failing %d in-flight requests", len(self._streams))
            self._dead = err
        self._fail_all(self._death())
        if self._dead is not None and self.on_dead is not None:
            self.on_dead(self._dead)

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Abort):
                self._abort(command.request_id)
            else:
                self._call(command)

    def _add(self, command: _Add) -> None:
        try:
            self.engine.add_processed(command.request_id, command.requests)
        except ValueError as err:
            command.stream.put(err)
            return
        self._streams[command.request_id] = command.stream

    def _abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        output = self.engine.abort_request(request_id)
        if output is not None:
            self._dispatch([output])

    def _call(self, command: _Call) -> None:
        try:
            command.future.set_result(command.fn(self.engine))
        except Exception as err:  # noqa: BLE001 - handed to the caller
            command.future.set_exception(err)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if output.finished:
                self._streams.pop(output.request_id, None)
            if stream is None:
                continue
            error = output.extra.get("error") if output.finished else None
            stream.put(output if error is None else RequestFailedError(error))

    def _notify_finished(self, output: RequestOutput) -> None:
        if self.on_finished is None:
            return
        try:
            self.on_finished(output)
        except Exception:  # noqa: BLE001 - a metrics bug must not kill the engine
            logger.exception("on_finished hook failed for request %s", output.request_id)

    def _snapshot_stats(self) -> None:
        self._stats = self.engine.get_stats().snapshot()

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            self._closed = True
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
        while True:  # commands that never ran: their callers must not wait forever
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Add):
                command.stream.put(error)
            elif isinstance(command, _Call):
                command.future.set_exception(error)

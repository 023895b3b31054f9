"""The `lamina bench serve` client: streams `/v1/completions` from any OpenAI-compatible server.

The arrival schedule is computed up front (:func:`arrival_schedule`, no clock involved), then each request
is sent at its offset from the run's start, through an optional concurrency limit, and timed chunk by
chunk (:func:`stream_completion`). Failures — HTTP errors, errors inside the stream, broken connections —
become failed :class:`RequestRecord` s, never exceptions.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import ssl
import time
from dataclasses import dataclass, field

import numpy as np

from .datasets import SampleRequest
from .metrics import RequestRecord
from .server_info import api_url, error_message, warm_up_hint

__all__ = ["ClientConfig", "Connector", "RunResult", "SSEDecoder", "api_url", "arrival_schedule", "benchmark",
           "build_payload", "stream_completion"]


@dataclass(frozen=True)
class ClientConfig:
    """How to reach the server and how to drive it."""

    api_url: str
    model: str
    api_key: str | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    extra_body: dict = field(default_factory=dict)
    timeout_s: float = 3600.0
    max_concurrency: int | None = None
    burstiness: float = 1.0
    seed: int = 0
    num_warmups: int = 1
    ready_timeout_s: float = 0.0
    disable_tqdm: bool = False

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if not self.burstiness > 0:
            raise ValueError(f"--burstiness must be > 0, got {self.burstiness}")
        if self.num_warmups < 0:
            raise ValueError(f"--num-warmups must be >= 0, got {self.num_warmups}")
        if not self.timeout_s > 0:
            raise ValueError(f"--request-timeout must be > 0, got {self.timeout_s}")


@dataclass
class RunResult:
    """The records of one run at one request rate, in dataset order, its wall time, and the client's CPU
    time over that wall time: near 1.0 the client itself was the bottleneck and latencies include its queueing.
    """

    request_rate: float
    records: list[RequestRecord]
    duration_s: float
    client_cpu_util: float = 0.0


def arrival_schedule(num_requests: int, request_rate: float, burstiness: float = 1.0,
                     seed: int = 0) -> list[float]:
    """Send offsets in seconds from the run's start; the first request goes at 0.

    Gaps are exponential with mean 1 / rate (a Poisson process) when burstiness is 1, gamma-distributed
    with the same mean otherwise (burstiness < 1 is burstier, > 1 more regular), as in vLLM. An infinite
    rate sends everything at 0.
    """
    if not request_rate > 0:
        raise ValueError(f"--request-rate must be > 0 or inf, got {request_rate}")
    if math.isinf(request_rate) or num_requests <= 1:
        return [0.0] * num_requests
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def build_payload(cfg: ClientConfig, request: SampleRequest) -> dict:
    """The streaming completions request body; `ignore_eos` is vLLM's extra field."""
    payload = {"model": cfg.model, "prompt": request.prompt, "max_tokens": request.expected_output_len,
               "temperature": cfg.temperature, "stream": True, "stream_options": {"include_usage": True}}
    if cfg.ignore_eos:
        payload["ignore_eos"] = True
    payload.update(cfg.extra_body)
    return payload


class SSEDecoder:
    """Server-sent events: returns each event's data once its blank line arrives."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._buffer = b""

    def feed_bytes(self, chunk: bytes) -> list[str]:
        """Take bytes as they arrive from the network; return the data of every event they complete."""
        *lines, self._buffer = (self._buffer + chunk).split(b"\n")
        events = (self.feed(line.rstrip(b"\r").decode("utf-8", "replace")) for line in lines)
        return [data for data in events if data is not None]

    def feed(self, line: str) -> str | None:
        """Take one line (without its newline); return the finished event's data, if any."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment, used as keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        """The pending event's data (a stream may end without its final blank line)."""
        if self._buffer:
            line, self._buffer = self._buffer, b""
            self.feed(line.rstrip(b"\r").decode("utf-8", "replace"))
        return self._dispatch()

    def _dispatch(self) -> str | None:
        data, self._data = self._data, []
        return "\n".join(data) if data else None


class _Stream:
    """Accumulates one response's chunks into a :class:`RequestRecord`."""

    def __init__(self, record: RequestRecord, sent: float) -> None:
        self.record, self.sent, self.last = record, sent, sent
        self.chunks = 0

    def on_event(self, data: str, now: float) -> None:
        if data.strip() == "[DONE]":
            return
        obj = json.loads(data)
        if obj.get("error"):
            raise RuntimeError(f"error in stream: {json.dumps(obj['error'])[:300]}")
        if obj.get("usage"):
            self.record.output_tokens = int(obj["usage"].get("completion_tokens") or 0)
            self.record.prompt_len = int(obj["usage"].get("prompt_tokens") or self.record.prompt_len)
            self.record.usage_reported = True
        if obj.get("choices"):
            self._on_choice(obj["choices"][0], now)

    def _on_choice(self, choice: dict, now: float) -> None:
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content")
        if not text and not choice.get("token_ids") and choice.get("finish_reason") is not None:
            return  # a bare finish marker carries no token (a server without a tokenizer sends token_ids)
        if self.chunks == 0:
            self.record.ttft = now - self.sent
        else:
            self.record.itl.append(now - self.last)
        self.last = now
        self.chunks += 1
        self.record.generated_text += text or ""

    def finish(self) -> None:
        if self.chunks == 0:
            raise RuntimeError("the stream ended without a content chunk")
        self.record.latency = self.last - self.sent
        if not self.record.usage_reported:
            self.record.output_tokens = self.chunks
        self.record.success = True


def _headers(cfg: ClientConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


async def stream_completion(connector: Connector, cfg: ClientConfig, request: SampleRequest,
                            t0: float = 0.0) -> RequestRecord:
    """Send one streaming request and time it, from just before its connection is opened."""
    record = RequestRecord(prompt_len=request.prompt_len, expected_output_len=request.expected_output_len)
    payload, headers, client = build_payload(cfg, request), _headers(cfg), connector.client()
    sent = time.perf_counter()
    record.start_time = sent - t0
    try:
        async with client, client.stream("POST", cfg.api_url, json=payload, headers=headers) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace").strip()
                record.error = f"HTTP {response.status_code}: {error_message(body)[:300]}"
                return record
            await _read_events(response, _Stream(record, sent))
    except Exception as err:  # noqa: BLE001 - every failure is a failed request, reported, never a crash
        record.success = False
        record.error = f"{type(err).__name__}: {err}"[:300]
    return record


async def _read_events(response: object, stream: _Stream) -> None:
    decoder = SSEDecoder()
    async for chunk in response.aiter_bytes():
        now = time.perf_counter()  # one read, one arrival time for every event it completes
        for data in decoder.feed_bytes(chunk):
            stream.on_event(data, now)
    tail = decoder.flush()
    if tail is not None:
        stream.on_event(tail, time.perf_counter())
    stream.finish()


class Connector:
    """Opens one `httpx.AsyncClient` (one connection) per request, as vLLM's client closes each connection.

    One shared pool holding hundreds of streaming connections costs httpcore bookkeeping over every
    connection on every read, which saturates the client and inflates the latencies it measures.
    """

    def __init__(self, cfg: ClientConfig) -> None:
        try:
            import httpx
        except ImportError as err:
            raise ValueError("lamina bench serve needs httpx: pip install httpx") from err
        self._httpx = httpx
        self._ssl = ssl.create_default_context()  # built once: building it per client costs ~20 ms
        self._timeout = httpx.Timeout(connect=60.0, read=cfg.timeout_s, write=cfg.timeout_s, pool=None)

    def client(self) -> object:
        """A fresh `httpx.AsyncClient`; use it as an async context manager."""
        return self._httpx.AsyncClient(verify=self._ssl, timeout=self._timeout)


async def warm_up(connector: Connector, cfg: ClientConfig, request: SampleRequest) -> None:
    """Send `num_warmups` requests; retry the first until it succeeds or `ready_timeout_s` has passed."""
    deadline = time.monotonic() + cfg.ready_timeout_s
    for index in range(cfg.num_warmups):
        record = await stream_completion(connector, cfg, request)
        while index == 0 and not record.success and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            record = await stream_completion(connector, cfg, request)
        if not record.success:
            raise ValueError(f"warm-up request to {cfg.api_url} failed: {record.error}\n"
                             f"  hint: {warm_up_hint(record.error or '')}")


async def run_rate(connector: Connector, cfg: ClientConfig, requests: list[SampleRequest],
                   request_rate: float) -> RunResult:
    """Send every request on the schedule for `request_rate`; gather the records."""
    schedule = arrival_schedule(len(requests), request_rate, cfg.burstiness, cfg.seed)
    limit = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else contextlib.nullcontext()
    bar = _progress(len(requests), request_rate, cfg.disable_tqdm)

    async def one(request: SampleRequest) -> RequestRecord:
        async with limit:
            record = await stream_completion(connector, cfg, request, t0)
        bar.update(1)
        return record

    t0, cpu0 = time.perf_counter(), time.process_time()
    tasks = []
    for request, offset in zip(requests, schedule):
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(request)))
    records = list(await asyncio.gather(*tasks))
    duration = time.perf_counter() - t0
    bar.close()
    return RunResult(request_rate, records, duration, (time.process_time() - cpu0) / duration)


def _progress(total: int, request_rate: float, disable: bool) -> object:
    from tqdm import tqdm

    return tqdm(total=total, desc=f"rate {request_rate:g}", unit="req", disable=disable)


async def run_sweep(cfg: ClientConfig, requests: list[SampleRequest], rates: list[float]) -> list[RunResult]:
    """Warm up once, then run every request rate in order."""
    if not requests:
        raise ValueError("--num-prompts must be >= 1")
    for rate in rates:
        arrival_schedule(1, rate)  # validates the rate before anything is sent
    connector = Connector(cfg)
    await warm_up(connector, cfg, requests[0])
    return [await run_rate(connector, cfg, requests, rate) for rate in rates]


def benchmark(cfg: ClientConfig, requests: list[SampleRequest], rates: list[float]) -> list[RunResult]:
    """Blocking entry point: :func:`run_sweep` in a fresh event loop."""
    return asyncio.run(run_sweep(cfg, requests, rates))

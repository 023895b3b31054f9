"""Property-based fuzz of the OpenAI server (issue #10): no input gets a 5xx, kills the engine or leaks a block.

    python -m lamina.bench.fuzz [--model DIR] [--cases 10000] [--seed 0] [--concurrency 8] [--result-file F]

Starts `lamina serve`'s app in-process (uvicorn on a free port, the demo model by default), sends `--cases`
requests drawn by hypothesis (lamina/bench/fuzz_cases.py: valid, near-valid, hostile and malformed bodies,
other endpoints; a few in flight at once; some abandoned by the client half-way) and checks every answer:

    every status < 500 (a 5xx is recorded with its body)
    a 4xx body is an OpenAI error {"error": {"message", "type", "param", "code"}}; a 400 / 404 for a request
      whose one hostile field is known names that field in `param`
    a valid request gets 200 (or 429); a 200 stream ends with [DONE] and holds no error event
    at the end: /health 200 (no engine death), the running / waiting gauges back to 0, no KV block held,
      check_integrity() passes

Needs hypothesis and httpx (`pip install lamina[bench]`). Exit status 0 when every check passed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from lamina import DEMO_MODEL, LLM
from lamina.bench.fuzz_cases import FuzzCase, FuzzTarget, generate_cases
from lamina.engine.async_engine import AsyncEngine
from lamina.server.app import build_app
from lamina.server.settings import ServerSettings

CASE_TIMEOUT = 120.0  # seconds: a case still unanswered then is a hang


@dataclass
class FuzzReport:
    cases: int = 0
    seconds: float = 0.0
    by_status: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    server_errors: list[dict] = field(default_factory=list)  # every 5xx, with its body
    problems: list[dict] = field(default_factory=list)  # every other failed check (first 50 kept)
    num_problems: int = 0
    engine_deaths: int = 0
    leaked_blocks: int = 0
    gauges_at_zero: bool = False
    integrity_error: str | None = None
    config: dict = field(default_factory=dict)

    @property
    def num_5xx(self) -> int:
        return len(self.server_errors)

    @property
    def ok(self) -> bool:
        return (self.num_5xx == 0 and self.engine_deaths == 0 and self.leaked_blocks == 0 and self.gauges_at_zero
                and self.integrity_error is None and self.num_problems == 0)


# ---- the server -------------------------------------------------------------------------------------

@dataclass
class FuzzServer:
    url: str
    engine: AsyncEngine
    server: uvicorn.Server
    thread: threading.Thread


def start_server(engine: AsyncEngine, settings: ServerSettings) -> FuzzServer:
    """The server app on 127.0.0.1 (a free port), run by uvicorn in a background thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(build_app(engine, settings), log_level="warning", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    return FuzzServer(f"http://127.0.0.1:{sock.getsockname()[1]}", engine, server, thread)


# ---- one case ---------------------------------------------------------------------------------------

def check_error_body(case: FuzzCase, status: int, raw: bytes) -> str | None:
    """The failed check for a 4xx answer, or None."""
    try:
        error = json.loads(raw)["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str)
        param, _ = error["param"], error["code"]
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"a {status} body is not an OpenAI error: {raw[:300]!r}"
    if status in (400, 404) and case.field is not None and param != case.field:
        return f"param {param!r} instead of {case.field!r}: {error['message'][:300]}"
    return None


def check_stream(raw: bytes) -> str | None:
    events = [line[5:].strip() for line in raw.decode("utf-8").splitlines() if line.startswith("data:")]
    if not events or events[-1] != "[DONE]":
        return f"the stream does not end with [DONE]: {raw[-300:]!r}"
    for event in events[:-1]:
        if "error" in json.loads(event):
            return f"the stream holds an error event: {event[:300]}"
    return None


def check_answer(case: FuzzCase, status: int, raw: bytes, content_type: str) -> str | None:
    if status >= 500:
        return None  # recorded as a server error
    if status >= 400:
        problem = check_error_body(case, status, raw)
        if problem is None and case.kind == "valid" and status != 429:
            problem = f"a valid request got {status}: {raw[:300]!r}"
        return problem
    if status == 200 and case.method == "POST" and content_type.startswith("text/event-stream"):
        return check_stream(raw)
    if status == 200 and case.method == "POST":
        return None if "choices" in json.loads(raw) else f"a 200 without choices: {raw[:300]!r}"
    return None


async def exchange(client: httpx.AsyncClient, case: FuzzCase) -> tuple[int, bytes, str]:
    headers = {"content-type": case.content_type} if case.content_type else {}
    content = case.body if case.method in ("POST", "PUT") else None
    async with client.stream(case.method, case.path, content=content, headers=headers) as response:
        raw = await response.aread()
        return response.status_code, raw, response.headers.get("content-type", "")


async def run_case(client: httpx.AsyncClient, case: FuzzCase, report: FuzzReport, body_limit: int) -> None:
    try:
        status, raw, content_type = await asyncio.wait_for(exchange(client, case), case.cancel_after or CASE_TIMEOUT)
    except asyncio.TimeoutError:
        label = "cancelled" if case.cancel_after is not None else "hang"
        report.by_status[label] = report.by_status.get(label, 0) + 1
        if label == "hang":
            _problem(report, case, f"no answer within {CASE_TIMEOUT:.0f} s")
        return
    except httpx.TransportError as err:
        report.by_status["transport_error"] = report.by_status.get("transport_error", 0) + 1
        if len(case.body) <= body_limit:  # a body over the limit may see the socket closed after its 413
            _problem(report, case, f"transport error: {err!r}")
        return
    report.by_status[str(status)] = report.by_status.get(str(status), 0) + 1
    if status >= 500:
        report.server_errors.append({"status": status, "body": raw[:1000].decode("utf-8", "replace"),
                                     "case": _describe(case)})
    try:
        problem = check_answer(case, status, raw, content_type)
    except (ValueError, TypeError, KeyError) as err:  # an answer that is not the JSON it claims to be
        problem = f"a {status} answer that does not parse: {err!r}: {raw[:300]!r}"
    if problem is not None:
        _problem(report, case, problem)


def _describe(case: FuzzCase) -> dict:
    return {"kind": case.kind, "method": case.method, "path": case.path, "field": case.field,
            "content_type": case.content_type, "body": case.body[:600].decode("utf-8", "replace")}


def _problem(report: FuzzReport, case: FuzzCase, message: str) -> None:
    report.num_problems += 1
    if len(report.problems) < 50:
        report.problems.append({"problem": message, "case": _describe(case)})


async def send_all(url: str, cases: list[FuzzCase], concurrency: int, report: FuzzReport, body_limit: int) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=CASE_TIMEOUT, limits=limits) as client:
        pending = iter(cases)

        async def worker() -> None:
            for case in pending:
                await run_case(client, case, report, body_limit)

        await asyncio.gather(*(worker() for _ in range(concurrency)))


# ---- the end state ----------------------------------------------------------------------------------

def gauges(url: str) -> dict[str, float]:
    values = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            values[sample.name] = sample.value
    return values


def check_end_state(server: FuzzServer, report: FuzzReport, timeout: float = 60.0) -> None:
    """/health, the gauges, the KV blocks held and check_integrity(), once every request has left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        g = gauges(server.url)
        report.gauges_at_zero = g["lamina:num_requests_running"] == g["lamina:num_requests_waiting"] == 0
        if report.gauges_at_zero and server.engine.num_inflight_seqs == 0:
            break
        time.sleep(0.05)
    healthy = httpx.get(server.url + "/health", timeout=10).status_code == 200
    report.engine_deaths = 0 if healthy and server.engine.is_alive else 1
    if report.engine_deaths:
        return
    kv = server.engine.engine.kv_manager
    report.leaked_blocks = server.engine.call(
        lambda _: kv.num_total_blocks - kv.num_free_blocks - kv.num_evictable_blocks).result(30)
    try:
        server.engine.check_integrity(timeout=30)
    except AssertionError as err:
        report.integrity_error = str(err)


def run(engine: AsyncEngine, settings: ServerSettings, cases: int, seed: int, concurrency: int = 8,
        max_tokens: int = 4) -> FuzzReport:
    """Fuzz a server over `engine` with `cases` requests; the caller owns (and shuts down) the engine."""
    target = FuzzTarget(settings.served_model_name, engine.engine.arch.vocab_size, engine.max_model_len,
                        settings.max_n, engine.engine.config.model_config.max_logprobs, settings.max_body_bytes,
                        max_tokens)
    report = FuzzReport(config={**asdict(target), "seed": seed, "concurrency": concurrency})
    drawn = generate_cases(target, cases, seed)
    report.by_kind = dict(Counter(case.kind for case in drawn))
    server = start_server(engine, settings)
    try:
        start = time.perf_counter()
        asyncio.run(send_all(server.url, drawn, concurrency, report, settings.max_body_bytes))
        report.seconds = time.perf_counter() - start
        report.cases = len(drawn)
        check_end_state(server, report)
    finally:
        server.server.should_exit = True
        server.thread.join(timeout=15)
    return report


def summary(report: FuzzReport) -> str:
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(report.by_status.items()))
    rows = [("cases", f"{report.cases:,}"), ("by status", statuses), ("5xx", report.num_5xx),
            ("engine deaths", report.engine_deaths), ("leaked blocks", report.leaked_blocks),
            ("gauges back to 0", report.gauges_at_zero), ("check_integrity", report.integrity_error or "passed"),
            ("other failed checks", report.num_problems), ("seconds", f"{report.seconds:.1f}")]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_MODEL, help="a local HF model directory (default: the demo model)")
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--max-tokens", type=int, default=4, help="the most tokens a valid case asks for")
    parser.add_argument("--result-file", help="write the JSON report here")
    args = parser.parse_args(argv)
    engine = AsyncEngine(LLM(model=args.model).engine)
    name = os.path.basename(os.path.normpath(args.model))
    settings = ServerSettings(served_model_name=name, max_n=4, max_body_bytes=64 * 1024, max_queue=64)
    try:
        report = run(engine, settings, args.cases, args.seed, args.concurrency, args.max_tokens)
    finally:
        engine.shutdown()
    report.config["model"] = args.model
    print(summary(report))
    for entry in report.server_errors[:10] + report.problems[:10]:
        print(json.dumps(entry)[:800])
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump({**asdict(report), "num_5xx": report.num_5xx, "ok": report.ok}, f, indent=2)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

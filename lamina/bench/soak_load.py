"""The soak's client side: a steady mix of requests against an OpenAI-compatible server, some cancelled.

    worker 1..C:  loop until the deadline:  plan() -> one request -> check() -> Tally
    plan:   completions | chat, stream or not, n in {1, 2, 3}, max_tokens in MAX_TOKENS, greedy or seeded
    cancel: ~cancel_fraction of the requests are dropped by the client at a random point:
            "early" (a random delay after sending, usually before the first token) or
            "mid_stream" (after a random number of SSE chunks)

Every response that is not cancelled must be complete and well-formed: 200, one finished choice per sample,
usage within bounds (non-streaming); `data: [DONE]` last, no error event and a finish_reason for every choice
(streaming). Anything else is counted by status (or by a short name: `timeout`, `malformed`, `stream_error`).
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

PROMPTS = ("def add(a, b):", "import numpy as np\n\n", "class Stack:\n    def __init__(self):",
           "# quicksort in python\ndef quicksort(xs):", "for i in range(10):", "def fib(n):\n    \"\"\"")
MAX_TOKENS = (1, 4, 16, 48, 96, 160)
FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class LoadConfig:
    url: str  # http://host:port
    model: str
    duration_s: float
    concurrency: int = 12
    cancel_fraction: float = 0.2
    seed: int = 0
    timeout_s: float = 300.0


@dataclass(frozen=True)
class Plan:
    """One request: what to send and whether (and where) the client gives up on it."""

    path: str
    body: dict
    cancel: str | None  # None | "early" | "mid_stream"
    cancel_after: float  # seconds ("early") or chunks ("mid_stream")

    @property
    def n(self) -> int:
        return self.body.get("n", 1)


@dataclass
class Tally:
    """What happened to the requests; `errors` by status code or short name."""

    sent: int = 0
    completed: int = 0
    cancelled: int = 0
    cancel_too_late: int = 0  # planned cancellations that found the response already complete
    errors: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # the first few errors, for the report
    greedy_texts: dict = field(default_factory=dict)  # (path, prompt, max_tokens) -> text of greedy n=1 answers
    greedy_mismatches: int = 0

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.examples) < 10:
            self.examples.append(f"{kind}: {detail[:300]}")

    @property
    def num_5xx(self) -> int:
        return sum(v for k, v in self.errors.items() if str(k).startswith("5"))


def plan(rng: random.Random, config: LoadConfig) -> Plan:
    """A random request of the mix."""
    prompt = rng.choice(PROMPTS) * rng.choice((1, 1, 2, 6))
    body: dict = dict(model=config.model, max_tokens=rng.choice(MAX_TOKENS), stream=rng.random() < 0.5)
    if rng.random() < 0.2:
        body["n"] = rng.choice((2, 3))
    body["temperature"] = 0 if rng.random() < 0.5 else 0.8
    if body["temperature"] and rng.random() < 0.5:
        body["seed"] = rng.randrange(1 << 32)
    if body["stream"] and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    chat = rng.random() < 0.4
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    cancel = None
    if rng.random() < config.cancel_fraction:
        cancel = "mid_stream" if body["stream"] and rng.random() < 0.5 else "early"
    after = rng.uniform(0.0, 0.3) if cancel == "early" else rng.randint(1, max(1, body["max_tokens"] // 2))
    return Plan("/v1/chat/completions" if chat else "/v1/completions", body, cancel, after)


def _check_final(plan: Plan, payload: dict) -> str | None:
    """Why a non-streaming answer is malformed, or None."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or sorted(c.get("index") for c in choices) != list(range(plan.n)):
        return f"choices {choices!r}"
    for c in choices:
        text = c["message"]["content"] if "messages" in plan.body else c.get("text")
        if not isinstance(text, str) or c.get("finish_reason") not in FINISH_REASONS:
            return f"choice {c!r}"
    usage = payload.get("usage") or {}
    if not 0 < usage.get("completion_tokens", -1) <= plan.n * plan.body["max_tokens"]:
        return f"usage {usage!r}"
    return None


def _check_events(plan: Plan, events: list[str]) -> tuple[str, str] | None:
    """(kind, detail) if a finished stream is malformed or carries an error event, else None."""
    if not events or events[-1] != "[DONE]":
        return "malformed", f"stream ended without [DONE]: {events[-3:]!r}"
    finished: set[int] = set()
    for event in events[:-1]:
        chunk = json.loads(event)
        if "error" in chunk:
            return "stream_error", event
        for c in chunk.get("choices", []):
            if c.get("finish_reason") is not None:
                if c["finish_reason"] not in FINISH_REASONS:
                    return "malformed", f"finish_reason {c!r}"
                finished.add(c["index"])
    if finished != set(range(plan.n)):
        return "malformed", f"finished choices {sorted(finished)} of n={plan.n}"
    return None


async def _send_final(client: httpx.AsyncClient, plan: Plan, tally: Tally) -> None:
    r = await client.post(plan.path, json=plan.body)
    if r.status_code != 200:
        tally.error(str(r.status_code), r.text)
        return
    payload = r.json()
    problem = _check_final(plan, payload)
    if problem:
        tally.error("malformed", problem)
        return
    tally.completed += 1
    _compare_greedy(plan, payload, tally)


async def _send_stream(client: httpx.AsyncClient, plan: Plan, tally: Tally) -> bool:
    """Returns False when the client dropped the stream on purpose (mid_stream cancellation)."""
    async with client.stream("POST", plan.path, json=plan.body) as r:
        if r.status_code != 200:
            tally.error(str(r.status_code), (await r.aread()).decode(errors="replace"))
            return True
        events: list[str] = []
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
                if plan.cancel == "mid_stream" and len(events) >= plan.cancel_after and events[-1] != "[DONE]":
                    return False  # leaving the block closes the connection half-way
    problem = _check_events(plan, events)
    if problem:
        tally.error(*problem)
    else:
        tally.completed += 1
    return True


def _compare_greedy(plan: Plan, payload: dict, tally: Tally) -> None:
    """Greedy n=1 answers to the same request must agree whatever they were batched with (informational)."""
    if plan.body["temperature"] != 0 or plan.n != 1:
        return
    c = payload["choices"][0]
    text = c["message"]["content"] if "messages" in plan.body else c["text"]
    key = (plan.path, plan.body.get("prompt") or plan.body["messages"][0]["content"], plan.body["max_tokens"])
    if tally.greedy_texts.setdefault(key, text) != text:
        tally.greedy_mismatches += 1


async def run_one(client: httpx.AsyncClient, plan: Plan, tally: Tally) -> None:
    """Send one request, cancel it as planned, check what comes back; never raises (but CancelledError)."""
    tally.sent += 1
    send = _send_stream(client, plan, tally) if plan.body["stream"] else _send_final(client, plan, tally)
    task = asyncio.ensure_future(send)
    try:
        if plan.cancel == "early":
            done, _ = await asyncio.wait({task}, timeout=plan.cancel_after)
            if not done:
                task.cancel()
                tally.cancelled += 1
                await asyncio.gather(task, return_exceptions=True)
                return
            tally.cancel_too_late += 1
        kept = await task
        if kept is False:
            tally.cancelled += 1
        elif plan.cancel == "mid_stream":
            tally.cancel_too_late += 1
    except httpx.TimeoutException as e:
        tally.error("timeout", repr(e))
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        tally.error(type(e).__name__, repr(e))


async def drive(config: LoadConfig, tally: Tally) -> None:
    """Run `concurrency` workers until the deadline (requests in flight then run to their end)."""
    deadline = time.monotonic() + config.duration_s
    limits = httpx.Limits(max_connections=config.concurrency + 4)
    async with httpx.AsyncClient(base_url=config.url, timeout=config.timeout_s, limits=limits) as client:
        async def worker(index: int) -> None:
            rng = random.Random(config.seed * 1000 + index)
            while time.monotonic() < deadline:
                await run_one(client, plan(rng, config), tally)

        await asyncio.gather(*(worker(i) for i in range(config.concurrency)))

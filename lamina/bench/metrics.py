"""Serving metrics from per-request records, with vLLM's definitions (`vllm bench serve`).

Per request, times on the client's clock from the moment the HTTP request is sent:

    send ──── first content chunk ── chunk ── chunk ── ... ── last content chunk
         TTFT                   ITL      ITL                ITL
         |<──────────────────────── E2E latency ─────────────────────────────>|

    TPOT = (E2E - TTFT) / (output_tokens - 1)       (requests with more than one output token)

Output tokens come from the server's `usage.completion_tokens` when it reports it, else from the count of
content chunks (one token a chunk). ITL is per chunk, so a server that sends several tokens in a chunk
(speculative decoding) shows larger ITLs while TPOT stays per token. Goodput counts completed requests
meeting every SLO given (TTFT, TPOT, E2E in ms; TPOT of a one-token request counts as 0), per second.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

SLO_KEYS = ("ttft", "tpot", "e2el")
METRICS = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
           ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"))


@dataclass
class RequestRecord:
    """What happened to one request. Times are seconds; `start_time` is relative to the run's start."""

    prompt_len: int
    expected_output_len: int
    success: bool = False
    error: str = ""
    start_time: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int = 0
    usage_reported: bool = False
    generated_text: str = ""

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first; 0 for a request of at most one token."""
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


@dataclass
class Distribution:
    """Mean, median, standard deviation and chosen percentiles of one metric, in milliseconds."""

    mean: float
    median: float
    std: float
    percentiles: dict[float, float]


@dataclass
class PointSummary:
    """The metrics of one run at one request rate."""

    request_rate: float
    max_concurrency: int | None
    duration_s: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution
    errors: dict[str, int]

    def to_json(self) -> dict:
        """A flat dict with vLLM's result keys (`mean_ttft_ms`, `p99_itl_ms`, ...); inf rate is "inf"."""
        out = {"request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate}
        for key in ("max_concurrency", "duration_s", "completed", "failed", "total_input_tokens",
                    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
                    "total_token_throughput"):
            out[key] = getattr(self, key)
        for name, _, _ in METRICS:
            dist: Distribution = getattr(self, name)
            out.update({f"mean_{name}_ms": dist.mean, f"median_{name}_ms": dist.median, f"std_{name}_ms": dist.std})
            out.update({f"p{percentile_word(p)}_{name}_ms": v for p, v in dist.percentiles.items()})
        out["errors"] = self.errors
        return out


def percentile_word(p: float) -> str:
    """50.0 -> "50", 99.9 -> "99.9" (the key vLLM writes)."""
    return str(int(p)) if float(p).is_integer() else str(p)


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile with linear interpolation between closest ranks (numpy's default); 0 if empty."""
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    return float(np.percentile(values, p)) if values else 0.0


def distribution(seconds: list[float], percentiles: list[float]) -> Distribution:
    """Summarise samples given in seconds as a :class:`Distribution` in milliseconds."""
    ms = [s * 1000.0 for s in seconds]
    if not ms:
        return Distribution(0.0, 0.0, 0.0, {p: 0.0 for p in percentiles})
    return Distribution(float(np.mean(ms)), percentile(ms, 50), float(np.std(ms)),
                        {p: percentile(ms, p) for p in percentiles})


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> `{"ttft": 500.0, "tpot": 50.0}` (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or []:
        key, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if key not in SLO_KEYS or ms < 0:
            raise ValueError(f"--goodput: {item!r} is not KEY:MS with KEY one of {', '.join(SLO_KEYS)} "
                             "and MS a non-negative number of milliseconds")
        slos[key] = ms
    return slos


def meets_slos(record: RequestRecord, slos: dict[str, float]) -> bool:
    """Whether a completed request is within every SLO (milliseconds)."""
    values = {"ttft": record.ttft, "tpot": record.tpot, "e2el": record.latency}
    return record.success and all(values[key] * 1000.0 <= limit for key, limit in slos.items())


def summarize(records: list[RequestRecord], duration_s: float, request_rate: float,
              max_concurrency: int | None = None, slos: dict[str, float] | None = None,
              percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)) -> PointSummary:
    """The metrics of one run: failed requests are counted and their errors tallied, never timed."""
    done = [r for r in records if r.success]
    pcts = list(percentiles)
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_tokens for r in done)
    duration = max(duration_s, 1e-9)
    goodput = sum(meets_slos(r, slos) for r in done) / duration if slos else None
    errors = Counter(r.error or "unknown error" for r in records if not r.success)
    return PointSummary(
        request_rate=request_rate, max_concurrency=max_concurrency, duration_s=duration_s,
        completed=len(done), failed=len(records) - len(done), total_input_tokens=total_in,
        total_output_tokens=total_out, request_throughput=len(done) / duration, request_goodput=goodput,
        output_throughput=total_out / duration, total_token_throughput=(total_in + total_out) / duration,
        ttft=distribution([r.ttft for r in done], pcts),
        tpot=distribution([r.tpot for r in done if r.output_tokens > 1], pcts),
        itl=distribution([gap for r in done for gap in r.itl], pcts),
        e2el=distribution([r.latency for r in done], pcts),
        errors=dict(errors.most_common()),
    )


def format_summary(s: PointSummary) -> str:
    """vLLM's result block for one run."""
    row = "{:<40} {:<10}".format
    num = "{:<40} {:<10.2f}".format
    lines = ["{:=^50}".format(" Serving Benchmark Result "), row("Successful requests:", s.completed),
             row("Failed requests:", s.failed)]
    if s.max_concurrency is not None:
        lines.append(row("Maximum request concurrency:", s.max_concurrency))
    lines.append(row("Request rate configured (RPS):", "inf" if math.isinf(s.request_rate) else s.request_rate))
    lines += [num("Benchmark duration (s):", s.duration_s), row("Total input tokens:", s.total_input_tokens),
              row("Total generated tokens:", s.total_output_tokens),
              num("Request throughput (req/s):", s.request_throughput)]
    if s.request_goodput is not None:
        lines.append(num("Request goodput (req/s):", s.request_goodput))
    lines += [num("Output token throughput (tok/s):", s.output_throughput),
              num("Total token throughput (tok/s):", s.total_token_throughput)]
    for name, short, header in METRICS:
        dist: Distribution = getattr(s, name)
        lines += ["{:-^50}".format(header), num(f"Mean {short} (ms):", dist.mean),
                  num(f"Median {short} (ms):", dist.median)]
        lines += [num(f"P{percentile_word(p)} {short} (ms):", v) for p, v in dist.percentiles.items()]
    for error, count in list(s.errors.items())[:5]:
        lines.append(f"failed x{count}: {error[:200]}")
    lines.append("=" * 50)
    return "\n".join(lines)


def format_sweep(summaries: list[PointSummary]) -> str:
    """One line per request rate: throughput and mean / p50 / p99 of TTFT, TPOT, ITL (ms)."""
    head = f"{'rate':>6} {'ok':>5} {'fail':>5} {'req/s':>7} {'good/s':>7} {'tok/s':>9}"
    for _, short, _ in METRICS[:3]:
        head += f" {short + ' mean':>10} {'p50':>8} {'p99':>8}"
    lines = [head]
    for s in summaries:
        good = "-" if s.request_goodput is None else f"{s.request_goodput:.2f}"
        line = (f"{'inf' if math.isinf(s.request_rate) else f'{s.request_rate:g}':>6} {s.completed:>5} "
                f"{s.failed:>5} {s.request_throughput:>7.2f} {good:>7} {s.output_throughput:>9.1f}")
        for name, _, _ in METRICS[:3]:
            dist: Distribution = getattr(s, name)
            line += f" {dist.mean:>10.1f} {dist.percentiles.get(50.0, dist.median):>8.1f}"
            line += f" {dist.percentiles.get(99.0, float('nan')):>8.1f}"
        lines.append(line)
    return "\n".join(lines)

"""Prometheus metrics with vLLM's names under the `lamina:` prefix, one CollectorRegistry per app.

    per request (observed once, when it finishes or is aborted; from the engine thread):
        lamina:request_success_total{finished_reason}     counter   stop | length | abort
        lamina:prompt_tokens_total, lamina:generation_tokens_total               counters
        lamina:time_to_first_token_seconds, lamina:time_per_output_token_seconds,
        lamina:e2e_request_latency_seconds, lamina:request_prompt_tokens,
        lamina:request_generation_tokens                                          histograms
    per scrape (read from the engine's latest stats snapshot):
        lamina:num_requests_running, lamina:num_requests_waiting, lamina:kv_cache_usage_perc,
        lamina:prefix_cache_hit_rate                                              gauges
        lamina:prefix_cache_queries_total, lamina:prefix_cache_hits_total,
        lamina:num_preemptions_total                                              counters
        lamina:spec_decode_num_drafts_total, lamina:spec_decode_num_draft_tokens_total,
        lamina:spec_decode_num_accepted_tokens_total,
        lamina:spec_decode_num_accepted_tokens_per_pos_total{position}            counters (speculation on)

Every metric carries a `model_name` label, as vLLM's do.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lamina.engine.stats import SchedulerStats
from lamina.outputs import RequestOutput

PREFIX = "lamina:"
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0, 160.0, 640.0)
_TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class _EngineCollector(Collector):
    """Gauges and engine-side counters, read at scrape time from a stats snapshot."""

    def __init__(self, stats: Callable[[], SchedulerStats], model_name: str) -> None:
        self._stats = stats
        self._labels = [model_name]

    def _family(self, kind: type, name: str, doc: str, value: float) -> Metric:
        family = kind(PREFIX + name, doc, labels=["model_name"])
        family.add_metric(self._labels, value)
        return family

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        yield self._family(gauge, "num_requests_running", "Requests in the running batch.", s.num_running)
        yield self._family(gauge, "num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield self._family(gauge, "kv_cache_usage_perc", "Fraction of KV-cache blocks held by requests (0-1).",
                           s.kv_usage)
        yield self._family(gauge, "prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / looked up.",
                           s.prefix_cache_hit_rate)
        yield self._family(counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                           s.prefix_cache_queries)
        yield self._family(counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                           s.prefix_cache_hits)
        yield self._family(counter, "num_preemptions", "Preemptions since start.", s.num_preemptions)
        yield from self._spec_decode(s)

    def _spec_decode(self, s: SchedulerStats) -> Iterator[Metric]:
        spec, counter = s.spec, CounterMetricFamily
        yield self._family(counter, "spec_decode_num_drafts", "Verify steps of requests with drafts.", spec.num_drafts)
        yield self._family(counter, "spec_decode_num_draft_tokens", "Draft tokens verified.", spec.num_draft_tokens)
        yield self._family(counter, "spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                           spec.num_accepted_tokens)
        per_pos = counter(PREFIX + "spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at each position.",
                          labels=["model_name", "position"])
        for position, accepted in enumerate(spec.accepted_per_pos):
            per_pos.add_metric([*self._labels, str(position)], accepted)
        yield per_pos


class ServerMetrics:
    """The server's metrics; `observe_finished` is the engine's on_finished hook (thread-safe)."""

    def __init__(self, stats: Callable[[], SchedulerStats], model_name: str) -> None:
        disable_created_metrics()  # no `*_created` series next to every counter (process-wide, as vLLM)
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.registry.register(_EngineCollector(stats, model_name))
        labels, reg = ["model_name"], self.registry
        self.request_success = Counter(PREFIX + "request_success", "Finished requests by finish reason.",
                                       ["model_name", "finished_reason"], registry=reg)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of finished requests.", labels,
                                     registry=reg)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Generated tokens of finished requests.",
                                         labels, registry=reg)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Arrival to first token.", labels,
                              buckets=_LATENCY_BUCKETS, registry=reg)
        self.tpot = Histogram(PREFIX + "time_per_output_token_seconds", "Mean time between output tokens.",
                              labels, buckets=_TPOT_BUCKETS, registry=reg)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Arrival to finish.", labels,
                             buckets=_LATENCY_BUCKETS, registry=reg)
        self.request_prompt_tokens = Histogram(PREFIX + "request_prompt_tokens", "Prompt tokens per request.",
                                               labels, buckets=_TOKEN_BUCKETS, registry=reg)
        self.request_generation_tokens = Histogram(PREFIX + "request_generation_tokens",
                                                   "Generated tokens per request.", labels,
                                                   buckets=_TOKEN_BUCKETS, registry=reg)

    def observe_finished(self, output: RequestOutput) -> None:
        """Record one finished (or aborted) request."""
        name = self.model_name
        reason = output.outputs[0].finish_reason if output.outputs else "abort"
        self.request_success.labels(name, reason or "abort").inc()
        num_prompt = len(output.prompt_token_ids)
        num_generated = sum(len(c.token_ids) for c in output.outputs)
        self.prompt_tokens.labels(name).inc(num_prompt)
        self.generation_tokens.labels(name).inc(num_generated)
        self.request_prompt_tokens.labels(name).observe(num_prompt)
        self.request_generation_tokens.labels(name).observe(num_generated)
        self._observe_latency(output)

    def _observe_latency(self, output: RequestOutput) -> None:
        m, name = output.metrics, self.model_name
        if m is None:
            return
        finished = m.finished_time if m.finished_time is not None else time.monotonic()
        self.e2e.labels(name).observe(max(0.0, finished - m.arrival_time))
        if m.first_token_time is None:
            return
        self.ttft.labels(name).observe(max(0.0, m.first_token_time - m.arrival_time))
        num_tokens = len(output.outputs[0].token_ids) if output.outputs else 0
        last = m.last_token_time if m.last_token_time is not None else finished
        if num_tokens > 1:
            self.tpot.labels(name).observe(max(0.0, last - m.first_token_time) / (num_tokens - 1))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

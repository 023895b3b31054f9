"""What the soak measures on the server side: its process's RSS, its /metrics, and the RSS trend.

    RSS trend over the samples (t, rss):
        start   the first sample (before any request)
        warm    the last sample at or before the end of the warm-up (t <= warmup_s)
        max_after_warmup, end
        growth_after_warmup = max_after_warmup / warm - 1      (the check: <= 5%)
        slope_mb_per_min    = least-squares slope of the samples after the warm-up
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the load started
    rss: int  # bytes
    metrics: dict[str, float]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process: psutil when installed, else /proc/PID/status (Linux)."""
    try:
        import psutil
    except ImportError:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # kB
        raise RuntimeError(f"no VmRSS in /proc/{pid}/status") from None
    return psutil.Process(pid).memory_info().rss


def scrape(url: str) -> dict[str, float]:
    """/metrics as {'name{label="v",...}': value}, labels sorted, model_name left out."""
    text = httpx.get(url + "/metrics", timeout=30).text
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name")
            values[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return values


def _slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / var if var else 0.0


def rss_trend(samples: list[Sample], warmup_s: float) -> dict:
    """The RSS figures of the docstring above (bytes; the slope in MB per minute)."""
    warm = [s for s in samples if s.t <= warmup_s][-1]
    after = [s for s in samples if s.t >= warm.t]
    peak = max(s.rss for s in after)
    slope = _slope([(s.t / 60, s.rss / (1 << 20)) for s in after])
    return dict(start=samples[0].rss, warm=warm.rss, warm_t=warm.t, end=samples[-1].rss, max_after_warmup=peak,
                growth_after_warmup=round(peak / warm.rss - 1, 5), slope_mb_per_min=round(slope, 4),
                num_samples=len(samples))

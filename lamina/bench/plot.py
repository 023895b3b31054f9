"""PNG of serving latency (TTFT, TPOT, ITL at p50 and p99) against request rate, from result JSON files.

Each result file (`lamina bench serve --result-file`) becomes one series, so a lamina sweep and a peer's
sweep made with the same tool land on the same axes. matplotlib is imported only here, and only when a
plot is asked for.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

PANELS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"))
STATS = (("p50", "-", "o"), ("p99", "--", "s"))


def load_result(path: str) -> dict:
    """A result file, checked to hold at least one point."""
    try:
        result = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a JSON result file ({err.msg})") from err
    if not isinstance(result, dict) or not result.get("points"):
        raise ValueError(f"{path}: no 'points' (is it a `lamina bench serve --result-file` output?)")
    return result


def rate_value(rate: float | str) -> float:
    """A point's request rate as a float ("inf" -> inf)."""
    return float(rate)


def x_positions(rates: list[float]) -> tuple[dict[float, float], float | None]:
    """Where each rate sits on the x axis: finite rates as they are, inf one step right of the largest."""
    finite = sorted(r for r in rates if not math.isinf(r))
    inf_x = None
    if any(math.isinf(r) for r in rates):
        inf_x = finite[-1] * 1.5 if finite else 1.0
    return {r: (inf_x if math.isinf(r) else r) for r in rates}, inf_x


def _pyplot() -> object:
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError("the PNG plot needs matplotlib: pip install matplotlib "
                          "(the JSON result does not)") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _value(point: dict, stat: str, metric: str) -> float | None:
    value = point.get(f"{stat}_{metric}_ms")
    if value is None and stat == "p50":
        value = point.get(f"median_{metric}_ms")
    return value


def plot_results(paths: list[str], out: str) -> str:
    """Write a PNG with one panel per metric and one line per (file, percentile); returns `out`."""
    results = [(path, load_result(path)) for path in paths]
    rates = [rate_value(p["request_rate"]) for _, r in results for p in r["points"]]
    xs, inf_x = x_positions(rates)
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4), squeeze=False)
    for ax, (metric, title) in zip(axes[0], PANELS):
        for path, result in results:
            _plot_series(ax, result, metric, xs, result.get("label") or Path(path).stem)
        ax.set_title(f"{title} (ms)")
        ax.set_xlabel("request rate (req/s)")
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        if inf_x is not None:
            ticks = [t for t in ax.get_xticks() if 0 <= t < inf_x * 0.9] + [inf_x]
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks[:-1]] + ["inf"])
    axes[0][0].set_ylabel("latency (ms)")
    axes[0][-1].legend(fontsize="small")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _plot_series(ax: object, result: dict, metric: str, xs: dict[float, float], label: str) -> None:
    points = sorted(result["points"], key=lambda p: rate_value(p["request_rate"]))
    for stat, style, marker in STATS:
        pairs = [(xs[rate_value(p["request_rate"])], _value(p, stat, metric)) for p in points]
        pairs = [(x, y) for x, y in pairs if y is not None]
        if pairs:
            ax.plot(*zip(*pairs), linestyle=style, marker=marker, label=f"{label} {stat}")

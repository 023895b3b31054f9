"""StepCostModel: the wall time of an engine step as a function of the tokens it computes, calibrated online from
measured steps (the adaptive speculation policy's cost, lamina/engine/spec_policy.py)."""
from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np


def _bucket(num_tokens: int) -> int:
    """Exact up to 16 tokens, then 8 buckets per doubling (about 9 % wide)."""
    return num_tokens if num_tokens <= 16 else 17 + int(8 * math.log2(num_tokens / 16))


def _isotonic(values: list[float], weights: list[int]) -> list[float]:
    """The non-decreasing sequence nearest `values` in weighted least squares (pool adjacent violators)."""
    if all(a <= b for a, b in zip(values, values[1:])):
        return list(values)  # already non-decreasing (the usual curve, refitted every step): itself
    blocks: list[list[float]] = []  # [mean, weight, length]
    for value, weight in zip(values, weights):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, weight_, length = blocks.pop()
            prev = blocks[-1]
            total = prev[1] + weight_
            blocks[-1] = [(prev[0] * prev[1] + mean * weight_) / total, total, prev[2] + length]
    return [mean for mean, _, length in blocks for _ in range(int(length))]


class StepCostModel:
    """Wall time of a step as a function of the tokens it computes, calibrated from measured steps.

    A step falls in a token-count bucket; a bucket keeps its last `window` steps and stands for the point
    (median tokens, median seconds) once it has `min_samples` of them. Before that it stands for its fastest
    step, but never above what the measured buckets predict there: one slow step (a first use, a stall) makes
    a step size look no dearer than its neighbours until it is measured again, so the policy tries it again
    instead of ruling it out for good. A bucket whose newest step is older than `max_age` seconds (at the
    newest step observed) is stale and counts as unmeasured again; its next step replaces its old ones. So a
    cost measured once and then never again, because it said drafting cannot pay (a warm-up's slow verify
    steps, a host since grown faster), is tried again within max_age, at the price of a few steps of the
    dearer kind. The points are made non-decreasing (isotonic) and joined linearly, the curve fitted again after
    every `refit_every` observed steps (1: after each; the engine's policy refits every few steps, since a fit
    costs a decision at batch 1 more than the rest of it). Where there are none:

        no point at all      1.0 s at every count: drafts look free, so the first verify steps get measured
        below the first x0   y0 * T / x0, proportional: the base step looks cheap, so it gets measured
        above the last xm    ym + s * (T - xm), s the slope from the point nearest xm / 2 (0 with one point),
                             clamped to [0, ym / xm]: optimistic, so speculating there gets measured
    """

    def __init__(self, window: int = 16, min_samples: int = 3, max_age: float = 4.0,
                 clock: Callable[[], float] = time.monotonic, refit_every: int = 1) -> None:
        self.window, self.min_samples, self.max_age, self.clock = window, min_samples, max_age, clock
        self.refit_every = refit_every
        self._unfitted = 0  # steps observed since the curve was last fitted
        self._buckets: dict[int, deque[tuple[int, float]]] = {}
        self._newest: dict[int, float] = {}  # bucket -> when its newest step was observed
        self._now = 0.0  # when the newest step of all was observed: the curve's age is judged at it
        # bucket -> (median tokens, median seconds, fastest seconds, steps), when clean
        self._points: dict[int, tuple[float, float, float, int]] = {}
        self._curve: tuple[np.ndarray, np.ndarray] | None = None
        self._scalar: tuple[list[float], list[float], float] | None = None  # the curve as lists, and its slope
        self._costs: dict[int, float] = {}  # tokens -> cost: the scalar answers of the fitted curve

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        bucket, now = _bucket(num_tokens), self.clock()
        steps = self._buckets.setdefault(bucket, deque(maxlen=self.window))
        if now - self._newest.get(bucket, now) > self.max_age:
            steps.clear()  # stale: this step starts the bucket again
        steps.append((num_tokens, seconds))
        self._newest[bucket] = self._now = now
        self._points.pop(bucket, None)
        self._unfitted += 1
        if self._scalar is None or self._unfitted >= self.refit_every:
            self._curve = self._scalar = None

    def seed(self, points: Iterable[tuple[int, float]]) -> None:
        """Steps timed at start-up, (tokens, seconds): each counts as `min_samples` measured steps."""
        for num_tokens, seconds in points:
            for _ in range(self.min_samples):
                self.observe(num_tokens, seconds)

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """The curve's (tokens, seconds) points, tokens increasing, seconds non-decreasing."""
        if self._curve is None:
            xs, ys, _ = self._scalar_curve()
            self._curve = np.array(xs, dtype=np.float64), np.array(ys, dtype=np.float64)
        return self._curve

    def _scalar_curve(self) -> tuple[list[float], list[float], float]:
        """The curve as lists and its slope above the last point: what a scalar cost needs, refitted after each
        observed step without building arrays (the policy asks scalars every step)."""
        if self._scalar is None:
            xs, ys = self._fitted()
            self._scalar, self._unfitted, self._costs = (xs, ys, _slope(xs, ys)), 0, {}
        return self._scalar

    def _fitted(self) -> tuple[list[float], list[float]]:
        """points() as lists, in plain Python (it runs after every observed step: no numpy on ~10 values)."""
        for bucket in self._buckets.keys() - self._points.keys():
            steps = self._buckets[bucket]
            seconds = sorted(x for _, x in steps)
            tokens = sorted(t for t, _ in steps)[len(steps) // 2]
            self._points[bucket] = (tokens, seconds[len(seconds) // 2], seconds[0], len(steps))
        horizon = self._now - self.max_age
        buckets = sorted(self._points)
        measured = [self._points[b][3] >= self.min_samples and self._newest[b] >= horizon for b in buckets]
        # (tokens, seconds, steps): a measured bucket's median step, an unmeasured or stale one's fastest
        points = [(x, median if m else fastest, n)
                  for (x, median, fastest, n), m in zip(map(self._points.__getitem__, buckets), measured)]
        if any(measured) and not all(measured):
            xs, ys = _fit([p for p, m in zip(points, measured) if m])
            slope = _slope(xs, ys)
            points = [p if m else (p[0], min(p[1], _evaluate_one(xs, ys, slope, p[0])), p[2])
                      for p, m in zip(points, measured)]
        return _fit(points)

    def cost(self, num_tokens: int | np.ndarray) -> np.ndarray | float:
        """Estimated seconds of a step of `num_tokens` tokens (elementwise; a float for an int, without numpy:
        the policy asks a few scalars every step, at ~25 us each through numpy)."""
        if not isinstance(num_tokens, (int, np.integer)):
            return _evaluate(*self.points(), num_tokens)
        curve, tokens = self._scalar_curve(), int(num_tokens)
        cost = self._costs.get(tokens)
        if cost is None:
            cost = self._costs[tokens] = _evaluate_one(*curve, tokens)
        return cost


def _fit(points: list[tuple[float, float, int]]) -> tuple[list[float], list[float]]:
    """(tokens, seconds, steps) points, tokens increasing -> the curve's (tokens, seconds), seconds made
    non-decreasing."""
    return [float(x) for x, _, _ in points], _isotonic([y for _, y, _ in points], [n for _, _, n in points])


def _slope(xs: list[float], ys: list[float]) -> float:
    """The curve's slope above its last point (StepCostModel's docstring): from the point nearest xs[-1] / 2."""
    if not xs:
        return 0.0
    anchor = max(bisect.bisect_right(xs, xs[-1] / 2) - 1, 0)
    slope = (ys[-1] - ys[anchor]) / (xs[-1] - xs[anchor]) if anchor < len(xs) - 1 else 0.0
    return min(max(slope, 0.0), ys[-1] / xs[-1])


def _evaluate(xs: np.ndarray, ys: np.ndarray, num_tokens: int | np.ndarray) -> np.ndarray:
    """The curve through (xs, ys) at `num_tokens`, extended as the StepCostModel docstring says."""
    tokens = np.asarray(num_tokens, dtype=np.float64)
    if not len(xs):
        return np.ones_like(tokens)
    out = np.interp(tokens, xs, ys)
    out = np.where(tokens < xs[0], ys[0] * tokens / xs[0], out)
    slope = _slope(xs.tolist(), ys.tolist())
    return np.where(tokens > xs[-1], ys[-1] + slope * (tokens - xs[-1]), out)


def _evaluate_one(xs: list[float], ys: list[float], slope: float, tokens: int) -> float:
    """_evaluate at one count, on the curve as lists (slope: its extension above the last point)."""
    if not xs:
        return 1.0
    if tokens <= xs[0]:
        return ys[0] * tokens / xs[0]
    if tokens >= xs[-1]:
        return ys[-1] + slope * (tokens - xs[-1])
    i = bisect.bisect_right(xs, tokens)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

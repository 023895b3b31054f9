"""The CPU few-row matmul choice: timed per weight shape and row bucket, F.linear unless weight-major is clearly
faster."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lamina.layers import cpu_matmul
from lamina.layers.cpu_matmul import ROW_BUCKETS, calibrate, row_bucket, weight_major_is_faster


class FakeClock:
    """A clock that only the fake matmuls advance, each by its own cost at the rows it is given."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def matmul(self, seconds_by_rows: dict[int, float]):
        def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            self.now += seconds_by_rows[x.shape[0]]
            return F.linear(x, w)
        return run


def test_row_buckets_cover_every_few_row_count() -> None:
    assert [row_bucket(r) for r in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_calibration_keeps_weight_major_only_where_it_is_faster_by_the_margin() -> None:
    clock = FakeClock()
    linear = clock.matmul({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0})
    # faster at 1 row, twice as slow at 2, faster but within the margin at 4, faster at 8
    weight_major = clock.matmul({1: 0.4, 2: 2.0, 4: 0.95, 8: 0.5})
    choices = calibrate(torch.randn(6, 5), linear, weight_major, clock=clock)
    assert choices == {(6, 5, 1): True, (6, 5, 2): False, (6, 5, 4): False, (6, 5, 8): True}


def test_a_shape_is_timed_once_and_answers_every_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_matmul, "_choices", {})
    calls = []

    def fake_calibrate(weight: torch.Tensor, **_: object) -> dict[tuple[int, int, int], bool]:
        calls.append(tuple(weight.shape))
        return {(*weight.shape, rows): rows == 2 for rows in ROW_BUCKETS}

    monkeypatch.setattr(cpu_matmul, "calibrate", fake_calibrate)
    weight = torch.randn(12, 7)
    assert [weight_major_is_faster(weight, rows) for rows in range(1, 9)] == [False, True] + [False] * 6
    assert calls == [(12, 7)]
    assert weight_major_is_faster(torch.randn(3, 7), 1) is False and calls == [(12, 7), (3, 7)]


def test_the_real_calibration_answers_for_every_bucket() -> None:
    """On this machine, whichever wins: one answer for each bucket."""
    weight = torch.randn(40, 24)
    choices = calibrate(weight, F.linear, cpu_matmul.weight_major_matmul)
    assert set(choices) == {(40, 24, rows) for rows in ROW_BUCKETS}
    assert all(isinstance(v, bool) for v in choices.values())

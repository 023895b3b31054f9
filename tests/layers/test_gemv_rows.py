"""gemv_rows: the GEMV against cuBLAS at a few rows, timed per weight shape, and dispatch's use of the answers."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from lamina.layers import dispatch, gemv_rows


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemv_rows, "_choices", {})


class FakeKernels:
    """A GEMV and a burst that charge each call by a table: (N, rows) -> (GEMV seconds, cuBLAS seconds); records
    the calls prepared for bursts and the bursts timed, in order."""

    def __init__(self, table: dict[tuple[int, int], tuple[float, float]]) -> None:
        self.table, self.called, self.prepared, self.timed = table, "", [], []

    def gemv(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        self.called = "gemv"
        return x @ weight.t()

    def burst(self, fn: Callable[[], torch.Tensor]) -> Callable[[], float]:
        self.called = "cublas"
        out = fn()  # F.linear leaves `called` as it is
        key = (out.shape[1], out.shape[0], self.called)
        self.prepared.append(key)
        gemv_s, cublas_s = self.table[key[:2]]

        def timed() -> float:
            self.timed.append(key)
            return gemv_s if key[2] == "gemv" else cublas_s
        return timed


def test_each_shape_keeps_the_kernel_faster_by_the_margin_per_row_bucket() -> None:
    small, large = torch.zeros(64, 32), torch.zeros(96, 32)
    fake = FakeKernels({(64, 2): (1.0, 2.0), (64, 4): (1.9, 2.0), (64, 8): (3.0, 2.0),
                        (96, 2): (2.5, 2.0), (96, 4): (1.0, 2.0), (96, 8): (1.0, 2.0)})
    todo = gemv_rows.pending([small, large, torch.zeros(64, 32)])
    assert [(w.shape[0], rows) for w, rows in todo] == [(64, 2), (64, 4), (64, 8), (96, 2), (96, 4), (96, 8)]
    assert gemv_rows.calibrate(todo, fake.gemv, fake.burst) == {"gemv": 3, "cublas": 2, "tie": 1}
    # 1.9 against 2.0 is within MARGIN: a tie, which leaves the rule to decide (None)
    assert [gemv_rows.gemv_is_faster(small, rows) for rows in range(2, 9)] == [True, None, None] + [False] * 4
    assert [gemv_rows.gemv_is_faster(large, rows) for rows in (2, 3, 5)] == [False, True, True]
    assert gemv_rows.gemv_is_faster(large, 9) is None  # more rows than any bucket: not measured
    # each kernel's burst prepared once a bucket, then timed ROUNDS times, the two interleaved
    assert fake.prepared[:2] == [(64, 2, "gemv"), (64, 2, "cublas")]
    assert fake.timed[:4] == [(64, 2, "gemv"), (64, 2, "cublas")] * 2
    assert fake.timed.count((64, 8, "gemv")) == fake.timed.count((64, 8, "cublas")) == gemv_rows.ROUNDS
    assert gemv_rows.pending([small, large]) == []  # a process keeps its answers
    assert gemv_rows.gemv_is_faster(small.half(), 2) is None  # another dtype is another kernel


def test_a_timing_that_fails_keeps_no_answer() -> None:
    weight = torch.zeros(64, 32)
    fake = FakeKernels({(64, 2): (1.0, 2.0), (64, 4): (1.0, 2.0)})  # no entry for 8 rows: its burst raises
    with pytest.raises(KeyError):
        gemv_rows.calibrate(gemv_rows.pending([weight]), fake.gemv, fake.burst)
    assert gemv_rows.gemv_is_faster(weight, 2) is None and len(gemv_rows.pending([weight])) == 3


def test_only_weights_that_fit_in_l2_together_are_timed() -> None:
    weights = [torch.zeros(64, 32, dtype=torch.bfloat16), torch.zeros(64, 32, dtype=torch.bfloat16)]  # 4 KB each
    assert gemv_rows.fits_in_l2(weights, 8192) and not gemv_rows.fits_in_l2(weights, 8191)


def test_first_calls_run_the_gemv_once_a_pending_bucket() -> None:
    seen = []
    todo = gemv_rows.pending([torch.zeros(64, 32), torch.zeros(40, 16, dtype=torch.float16)])
    gemv_rows.first_calls(todo, lambda x, w: seen.append((tuple(x.shape), x.dtype, w.dtype)))
    assert seen == [((rows, 32), torch.float32, torch.float32) for rows in gemv_rows.ROW_BUCKETS] + [
        ((rows, 16), torch.float16, torch.float16) for rows in gemv_rows.ROW_BUCKETS]


def test_dispatch_follows_the_measurement_and_keeps_its_rule_elsewhere() -> None:
    """One row: always the GEMV, even of a weight that cuBLAS beat at 2 rows. Measured rows: the measurement,
    either way. A tie, or a weight not measured: the element rule (a small weight takes up to 8 rows, the kernel's
    limit caps them)."""
    weight, other = torch.zeros(64, 32), torch.zeros(48, 32)
    fake = FakeKernels({(64, 2): (2.0, 1.0), (64, 4): (1.0, 2.0), (64, 8): (2.0, 2.0)})
    gemv_rows.calibrate(gemv_rows.pending([weight]), fake.gemv, fake.burst)
    assert [dispatch.gemv_takes(weight, rows, 8) for rows in (1, 2, 3, 4, 8, 9)] == [True, False, True, True, True,
                                                                                     False]
    assert [dispatch.gemv_takes(other, rows, 8) for rows in (1, 2, 8)] == [True, True, True]
    assert not dispatch.gemv_takes(other, 5, 4) and not dispatch.gemv_takes(other, 0, 8)


def test_a_measured_loss_overrides_the_element_rule_at_one_shape_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """gemv_for: where the rule would send 4 rows of a small weight to the GEMV, its measured loss sends them to
    cuBLAS; the same rows of an unmeasured weight still go to the GEMV."""
    kernel = type("Gemv", (), {"MAX_M": 8})
    monkeypatch.setattr(dispatch, "on_kernel_device", lambda x: True)
    monkeypatch.setattr(dispatch, "_gemv_module", lambda: kernel)
    weight, other = torch.zeros(64, 32, dtype=torch.bfloat16), torch.zeros(48, 32, dtype=torch.bfloat16)
    fake = FakeKernels({(64, 2): (1.0, 2.0), (64, 4): (3.0, 2.0), (64, 8): (3.0, 2.0)})
    gemv_rows.calibrate(gemv_rows.pending([weight]), fake.gemv, fake.burst)
    x = torch.zeros(4, 32, dtype=torch.bfloat16)
    assert dispatch.gemv_for(x, weight, dispatch.DEFAULT_KERNELS) is None
    assert dispatch.gemv_for(x, other, dispatch.DEFAULT_KERNELS) is kernel
    assert dispatch.gemv_for(x[:2], weight, dispatch.DEFAULT_KERNELS) is kernel


def test_linear_weights_are_the_two_dimensional_weights_of_the_dtype() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=True), torch.nn.Linear(64, 32),
                                torch.nn.Linear(32, 64).to(torch.float16), torch.nn.Linear(32, 64))
    model.register_parameter("scales", torch.nn.Parameter(torch.zeros(64, 2)))  # a 2-D parameter not named weight
    weights = gemv_rows.linear_weights(model, (torch.float32,))
    assert [tuple(w.shape) for w in weights] == [(64, 32), (32, 64), (64, 32)]
    assert [w.dtype for w in gemv_rows.linear_weights(model, (torch.float16,))] == [torch.float16]

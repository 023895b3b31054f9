"""The step cost model (engine/step_cost.py): a step's cost as a function of its tokens, from noisy measured steps;
before and beyond its measurements; one slow step; costs gone stale; when the curve is fitted again."""
from __future__ import annotations

import numpy as np
import pytest

from lamina.engine.step_cost import StepCostModel


def test_cost_model_recovers_a_known_curve_from_noisy_steps() -> None:
    def curve(t):
        return 0.005 + 0.005 * np.maximum(np.asarray(t, dtype=np.float64) - 128, 0) / 128
    rng = np.random.default_rng(0)
    model = StepCostModel()
    for _ in range(4000):
        t = int(np.exp(rng.uniform(0, np.log(1024))))
        noise = rng.lognormal(0, 0.1) * (5.0 if rng.random() < 0.05 else 1.0)  # 5 % stalls
        model.observe(t, float(curve(t)) * noise)
    queries = np.array([1, 4, 16, 64, 128, 200, 256, 512, 1000])
    estimate = model.cost(queries)
    assert np.all(np.abs(estimate / curve(queries) - 1) < 0.1), estimate / curve(queries)
    assert np.all(np.diff(model.cost(np.arange(1, 2000))) >= 0)


def test_cost_model_before_and_beyond_its_measurements() -> None:
    model = StepCostModel()
    assert model.cost(10) == 1.0  # nothing measured: drafts look free, so a verify step gets measured
    model.observe(40, 0.010)
    assert model.cost(10) == pytest.approx(0.0025)  # below: proportional, so the base step gets measured
    assert model.cost(400) == pytest.approx(0.010)  # above one point: flat
    model.seed([(10, 0.010), (20, 0.011)])  # each counts as 3 steps
    assert model.cost(10) == pytest.approx(0.010)
    assert model.cost(20) == model.cost(40) == pytest.approx(0.01075)  # made non-decreasing, weighted by steps
    model.observe(40, 0.030)
    assert model.cost(40) == pytest.approx(0.0106)  # 2 steps at 40: their minimum (0.010), pooled with 20
    model.observe(40, 0.020)
    assert model.cost(40) == pytest.approx(0.020) and model.cost(30) == pytest.approx(0.0155)  # 3: the median


def test_one_slow_step_does_not_rule_out_a_step_size_until_it_is_measured_again() -> None:
    """A first verify step that happened to be slow (a first use, a stall) looks no dearer than the measured
    steps predict until its bucket has min_samples steps; then their median rules (regression: one 272 ms
    first verify on a CPU beside 35 ms decodes switched speculation off for the rest of the run)."""
    model = StepCostModel()
    model.seed([(1, 0.035)])
    model.observe(4, 0.272)
    assert model.cost(4) == pytest.approx(0.035)  # flat beyond the one measured point
    model.observe(4, 0.040)
    assert model.cost(4) == pytest.approx(0.035)
    model.observe(4, 0.041)
    assert model.cost(4) == pytest.approx(0.041)  # measured: the median of 272, 40, 41 ms
    model.observe(1, 0.5)  # a stall in a measured bucket moves its median only
    assert model.cost(1) == pytest.approx(0.035)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_cost_not_measured_for_max_age_seconds_is_measured_again() -> None:
    """The warm-up's verify steps were slow (2.1 ms against 0.47 for a plain step) and said that no drafts could
    pay, so none was ever measured again (the H200's batch-1 trace, session 31): a bucket whose newest step is
    older than max_age counts as unmeasured until it is measured anew."""
    clock = Clock()
    model = StepCostModel(max_age=4.0, clock=clock)
    for _ in range(3):
        model.observe(4, 0.0021)
        model.observe(1, 0.00047)
    for _ in range(100):  # plain steps only, for 3.96 s: the verify steps' cost still stands
        clock.now += 0.0396
        model.observe(1, 0.00047)
    assert model.cost(4) == pytest.approx(0.0021)
    clock.now += 0.1
    model.observe(1, 0.00047)  # 4.06 s after the last verify step
    assert model.cost(4) == pytest.approx(0.00047)  # as the fresh curve predicts (flat beyond one point)
    model.observe(4, 0.0014)  # measured again: the stale steps are gone, not pooled with the new ones
    model.observe(4, 0.0015)
    assert model.cost(4) == pytest.approx(0.00047)  # two new steps: still unmeasured
    model.observe(4, 0.0013)
    assert model.cost(4) == pytest.approx(0.0014)  # the median of the three new steps


def test_when_every_cost_is_stale_each_bucket_stands_for_its_fastest_step() -> None:
    """A long stretch without observed steps (the gate's plain windows) does not make every step look free."""
    clock = Clock()
    model = StepCostModel(max_age=4.0, clock=clock)
    for seconds in (0.003, 0.002, 0.004):
        model.observe(1024, seconds)
        model.observe(256, seconds / 2)
    clock.now += 60.0
    model.observe(256, 0.0012)  # the first step after it: 256 fresh (one step), 1024 stale
    assert model.cost(256) == pytest.approx(0.0012)  # unmeasured: its one step since (the stale ones are gone)
    assert model.cost(1024) == pytest.approx(0.002)  # stale, nothing measured to cap it: its fastest


def test_the_curve_is_fitted_again_every_refit_every_steps() -> None:
    """refit_every = 4: the first fit follows the first step; steps after it change the curve only once four of
    them are in (a scalar answer is kept until then); refit_every = 1 fits after each."""
    lazy, eager = StepCostModel(refit_every=4), StepCostModel()
    for model in (lazy, eager):
        model.seed([(1, 0.010)])
        assert model.cost(1) == pytest.approx(0.010)
        for _ in range(3):
            model.observe(1, 0.020)
    assert eager.cost(1) == pytest.approx(0.020)  # the median of 3 x 10 ms, 3 x 20 ms
    assert lazy.cost(1) == pytest.approx(0.010)  # three steps since the fit: not yet
    lazy.observe(1, 0.020)
    assert lazy.cost(1) == pytest.approx(0.020)

"""The stall diagnostics of the benchmarks: garbage-collector pauses and steps far slower than their kind's median."""
from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from lamina.bench.stalls import FIELDS, STALL_FACTOR, GcPauses, seconds_by_kind, stall_fields


def _steps(kind: str, ms: list[float]) -> list[SimpleNamespace]:
    return [SimpleNamespace(kind=kind, seconds=m / 1000) for m in ms]


def test_a_step_over_the_factor_of_its_kinds_median_is_a_stall():
    steps = _steps("decode ahead", [3.6, 3.7, 3.5, 41.0, 3.6]) + _steps("verify", [9.0, 9.5, 30.0])
    fields = stall_fields(seconds_by_kind(steps))
    # 41.0 is over 4 x 3.6; the verify steps' 30.0 is under 4 x 9.5
    assert fields["stall_steps"] == 1
    assert fields["stall_ms"] == pytest.approx(41.0 - 3.6)
    assert fields["slowest_step_ms"] == pytest.approx(41.0)
    assert STALL_FACTOR * 9.5 > 30.0


def test_no_steps_no_stalls():
    assert stall_fields(seconds_by_kind([])) == {"slowest_step_ms": 0.0, "stall_steps": 0, "stall_ms": 0.0}


def test_gc_pauses_records_the_collections_inside_the_block_only():
    with GcPauses() as pauses:
        gc.collect()
        gc.collect(0)
    gc.collect()
    assert [generation for generation, _ in pauses.collections] == [2, 0]
    assert all(seconds >= 0 for _, seconds in pauses.collections)
    fields = pauses.fields()
    assert fields["gc_full"] == 1 and fields["gc_ms"] == pytest.approx(1000 * sum(s for _, s in pauses.collections))
    assert pauses._callback not in gc.callbacks


def test_fields_names_what_the_two_report():
    with GcPauses() as pauses:
        pass
    assert set(stall_fields(seconds_by_kind(_steps("decode", [1.0])))) | set(pauses.fields()) == set(FIELDS)

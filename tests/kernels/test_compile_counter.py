"""The compile counter chains in front of Triton's cache-miss hook and counts every miss."""
from __future__ import annotations

import pytest

from lamina.kernels import compile_counter

knobs = pytest.importorskip("triton").knobs


def test_counts_misses_and_keeps_the_hook_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_counter, "_installed", False)
    monkeypatch.setattr(compile_counter, "_count", 0)
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append(kw["key"]) or True)
    assert compile_counter.install() and compile_counter.install()  # a second install adds no second hook
    assert knobs.runtime.jit_cache_hook(key="k1") is True  # the earlier hook's answer (True: skip) stands
    knobs.runtime.jit_cache_hook(key="k2")
    assert compile_counter.count() == 2 and seen == ["k1", "k2"]
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(compile_counter, "_installed", False)
    compile_counter.install()
    assert knobs.runtime.jit_cache_hook(key="k3") is False and compile_counter.count() == 3  # False: compile

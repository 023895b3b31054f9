"""Triton kernel compiles in this process (in-memory cache misses), counted for the engine's step stats.

`install()` chains a counting hook in front of whatever `triton.knobs.runtime.jit_cache_hook` holds (the
warm-up's skip pass swaps its own in and back out around it). It imports triton only when called, so the
CPU path never does; without triton the count stays 0.
"""
from __future__ import annotations

from typing import Any

_count = 0
_installed = False


def install() -> bool:
    """Start counting (once per process); False when triton is not importable."""
    global _installed
    if _installed:
        return True
    try:
        from triton import knobs
    except ImportError:
        return False
    previous = knobs.runtime.jit_cache_hook

    def on_miss(*args: Any, **kwargs: Any) -> Any:
        global _count
        _count += 1
        return previous(*args, **kwargs) if previous is not None else False  # False: Triton compiles

    knobs.runtime.jit_cache_hook = on_miss
    _installed = True
    return True


def count() -> int:
    """Compiles seen since install()."""
    return _count

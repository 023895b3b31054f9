"""Test-session setup shared by every test directory.

Triton's interpreter must be chosen before `triton` is first imported anywhere in the process (the
`triton.jit` decorator and triton.language's own jitted helpers pick it at import time), and other
tests import transformers, which imports triton. So it is set here, in the root conftest, which pytest
loads before collecting any test module. Only Triton kernels see it: they run on CPU tensors.
"""
from __future__ import annotations

import gc
import itertools
import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"


THAW_EVERY = 25  # tests
_tests_run = itertools.count(1)


@pytest.fixture(autouse=True)
def _thaw_heap():  # noqa: ANN201 - a fixture
    """Every engine freezes the heap alive at its start-up (lamina.engine.engine.freeze_heap), so that a long-lived
    process's collections stay cheap; a test process builds hundreds of engines, and the cycles of those it dropped
    would never be collected. Thawed every THAW_EVERY tests: after each test, every engine's start-up collection
    walked the whole heap again (tests/engine: 61 s against 41 s)."""
    yield
    if next(_tests_run) % THAW_EVERY == 0:
        gc.unfreeze()

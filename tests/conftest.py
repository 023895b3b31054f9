"""Test-session setup shared by every test directory.

Triton's interpreter must be chosen before `triton` is first imported anywhere in the process (the
`triton.jit` decorator and triton.language's own jitted helpers pick it at import time), and other
tests import transformers, which imports triton. So it is set here, in the root conftest, which pytest
loads before collecting any test module. Only Triton kernels see it: they run on CPU tensors.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

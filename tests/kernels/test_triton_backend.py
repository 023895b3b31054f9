"""The Triton backend: a mixed batch routed to both kernels, the registry, fallbacks and refusals."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (CI installs it with the test extra)")

from lamina.attention import torch_ref, triton_backend  # noqa: E402
from lamina.attention.backends import get_attention_backend  # noqa: E402
from lamina.attention.triton_backend import DECODE_MAX_Q, TritonAttentionBackend, plan_decode  # noqa: E402
from tests.kernels.cases import make_case, tolerance  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_batch_matches_reference(dtype: torch.dtype) -> None:
    # a prompt, a chunk over a 13-token prefix, a decode, a 1 + 3 verification, a 9-token chunk
    # (just past DECODE_MAX_Q: prefill kernel) and a long decode that the decode kernel splits
    seq_lens, q_lens = [23, 25, 40, 30, 17, 1100], [23, 12, 1, 4, 9, 1]
    case = make_case(seq_lens, q_lens, 4, 2, 64, 16, dtype, seed=7)
    backend = get_attention_backend("triton")
    assert isinstance(backend, TritonAttentionBackend) and backend.name == "triton"
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    out = backend.forward(case.q, case.k, case.v, k_cache, v_cache, case.metadata, case.scale)
    expected_k, expected_v = case.stored_caches()
    torch.testing.assert_close(k_cache, expected_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, expected_v, atol=0, rtol=0, equal_nan=True)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.float(), case.reference(), **tolerance(dtype))


def test_plan_decode() -> None:
    def plan(q_lens: list[int]) -> int:
        return plan_decode(make_case([max(q, 20) for q in q_lens], q_lens, 2, 1, 16, 16).metadata)
    assert plan([1, 1, 1]) == 1
    assert plan([1, 4, 2]) == 4
    assert plan([1, 30]) == DECODE_MAX_Q
    assert plan([30, 12]) == 0  # no decode rows: the decode kernel is not launched
    graph = make_case([20, 20], [30, 12], 2, 1, 16, 16).metadata  # a graph's: rows of 1 to 30 tokens a replay
    graph.min_query_len = 1
    assert plan_decode(graph) == DECODE_MAX_Q


def test_unsupported_head_dim_falls_back_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    case = make_case([9, 5], [9, 1], 4, 2, 8, 4, seed=1)  # head_dim 8: below tl.dot's minimum
    backend = TritonAttentionBackend()
    with caplog.at_level(logging.WARNING, logger=triton_backend.__name__):
        for _ in range(2):
            k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
            out = backend.forward(case.q, case.k, case.v, k_cache, v_cache, case.metadata, case.scale)
    assert [r.getMessage() for r in caplog.records] == [
        "triton attention: head_dim 8 with torch.float32 queries / torch.float32 cache is not supported; "
        "using the torch reference"]
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
    expected = torch_ref.forward(case.q, case.k, case.v, k_cache, v_cache, case.metadata, case.scale)
    torch.testing.assert_close(out, expected, atol=0, rtol=0, equal_nan=True)


def test_cpu_tensors_without_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_backend, "kernels_interpreted", lambda: False)
    case = make_case([6], [6], 2, 1, 16, 4, seed=2)
    with pytest.raises(ValueError, match=r"attention_backend='triton' needs CUDA tensors, got cpu"):
        TritonAttentionBackend().forward(case.q, case.k, case.v, case.k_cache, case.v_cache,
                                         case.metadata, case.scale)
    # what "auto" builds on a GPU machine: a CPU model there gets the reference path
    out = TritonAttentionBackend(cpu_fallback=True).forward(
        case.q, case.k, case.v, case.k_cache, case.v_cache, case.metadata, case.scale)
    torch.testing.assert_close(out, case.reference(), atol=1e-5, rtol=1e-5)


def test_auto_is_torch_without_cuda_and_lamina_imports_without_triton() -> None:
    assert get_attention_backend("auto").name == ("triton" if torch.cuda.is_available() else "torch")
    code = ("import sys, lamina\n"
            "from lamina.attention.backends import get_attention_backend\n"
            "get_attention_backend('torch')\n"
            "assert 'triton' not in sys.modules, 'triton imported eagerly'\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).parents[2])

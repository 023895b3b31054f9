"""The kernel warm-up: its batches fit the engine's limits, and its forwards leave the KV cache as it was."""
from __future__ import annotations

import pytest
import torch

import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 and the interpreter fixes
from lamina import LLM
from lamina.config import KernelChoice
from lamina.kernels import gemv as gemv_kernel
from lamina.kernels.tiles import LONG_QUERY
from lamina.kv.cache import attention_layers
from lamina.layers import gemv_rows
from lamina.worker import warmup
from lamina.worker.warmup import warm_up_kernels, warmup_batches
from tests.helpers.tiny_models import make_tiny_model


@pytest.mark.parametrize("budget,max_len", [(8192, 4096), (2048, 40960), (64, 64), (16, 4096)])
def test_batches_fit_the_budget_and_cover_both_prefill_tiles(budget: int, max_len: int) -> None:
    batches = warmup_batches(budget, max_len)
    assert batches
    for rows in batches:
        assert sum(q for q, _ in rows) <= budget and all(1 <= q <= s <= max_len for q, s in rows)
    longest = max(q for rows in batches for q, _ in rows)
    assert (longest >= LONG_QUERY) == (min(budget - 2, max_len) >= LONG_QUERY)
    assert [len(rows) for rows in batches if all(q == 1 for q, _ in rows)][-8:] == list(range(1, 9))  # GEMV M=1..8


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_warm_up_stores_nothing(tmp_path, backend: str) -> None:
    model_dir = make_tiny_model("qwen3", tmp_path, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                                head_dim=32, num_hidden_layers=1)
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, device="cpu", attention_backend=backend,
              block_size=8, num_kv_blocks=32, max_model_len=64, max_num_batched_tokens=80)
    worker = llm.engine.executor.worker
    caches = [layer.kv_cache for layer in attention_layers(worker.model)]
    for k, v in caches:
        k.normal_(), v.normal_()
    before = [(k.clone(), v.clone()) for k, v in caches]
    warm_up_kernels(worker.model, 8, 80, 64, torch.device("cpu"))
    for (k, v), (k0, v0) in zip(caches, before):
        assert torch.equal(k, k0) and torch.equal(v, v0)


class TwoLayers(torch.nn.Module):
    """A model's weights as the GEMV timing sees them: two bf16 linear layers of one shape and one of another, a
    float32 one (not the GEMV's), and the model's KernelChoice."""

    def __init__(self, kernels: KernelChoice) -> None:
        super().__init__()
        self.kernels = kernels
        self.a, self.b = (torch.nn.Linear(32, 64, bias=False, dtype=torch.bfloat16) for _ in range(2))
        self.c = torch.nn.Linear(64, 48, bias=False, dtype=torch.bfloat16)
        self.d = torch.nn.Linear(32, 16, bias=False)


L2 = 1 << 20  # an L2 cache that holds TwoLayers' weights


@pytest.fixture
def timing(monkeypatch: pytest.MonkeyPatch) -> dict:
    """gemv_rows' choices fresh, precompile and calibrate recorded in the order called (calibrate's answers: every
    bucket to the GEMV), the GEMV kernel replaced by a recorder of its calls."""
    seen: dict = {"order": [], "precompiled": [], "timed": [], "gemv": []}
    monkeypatch.setattr(gemv_rows, "_choices", {})
    monkeypatch.setattr(warmup, "precompile", lambda run: seen["order"].append("precompile") or
                        seen["precompiled"].append(run))
    monkeypatch.setattr(gemv_kernel, "gemv", lambda x, w, pdl: seen["gemv"].append((x.shape[0], tuple(w.shape), pdl)))

    def calibrate(todo: list, gemv) -> dict:  # noqa: ANN001
        seen["order"].append("calibrate")
        seen["timed"].append([(tuple(w.shape), rows) for w, rows in todo])
        return {"gemv": len(todo), "cublas": 0, "tie": 0}
    monkeypatch.setattr(gemv_rows, "calibrate", calibrate)
    return seen


def test_the_gemv_is_timed_at_a_few_rows_of_each_weight_shape_after_compiling_them(timing: dict) -> None:
    warmup._time_gemv_rows(TwoLayers(KernelChoice()), L2)
    buckets = [(shape, rows) for shape in ((64, 32), (48, 64)) for rows in gemv_rows.ROW_BUCKETS]
    assert timing["timed"] == [buckets] and timing["order"] == ["precompile", "calibrate"]
    (run,) = timing["precompiled"]  # one pass compiling every variant the timing runs, before it
    run()
    assert [(rows, shape) for rows, shape, _ in timing["gemv"]] == [(rows, shape) for shape, rows in buckets]
    assert not any(pdl for _, _, pdl in timing["gemv"])  # CPU weights: no PDL


def test_a_model_whose_layers_may_not_take_the_gemv_times_nothing(timing: dict) -> None:
    warmup._time_gemv_rows(TwoLayers(KernelChoice(gemv=False)), L2)
    assert timing["order"] == []


def test_a_model_whose_weights_outgrow_l2_times_nothing(timing: dict) -> None:
    """Its steps read the weights from HBM, which a burst of one weight does not: the rule by size decides."""
    model = TwoLayers(KernelChoice())
    warmup._time_gemv_rows(model, sum(w.numel() * 2 for w in gemv_rows.linear_weights(model, (torch.bfloat16,))) - 1)
    assert timing["order"] == []


def test_a_timing_the_platform_refuses_leaves_the_rule_by_weight_size(monkeypatch: pytest.MonkeyPatch, timing: dict,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    def refuse(todo: list, gemv) -> dict:  # noqa: ANN001
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(gemv_rows, "calibrate", refuse)
    with caplog.at_level("WARNING", logger="lamina.worker.warmup"):
        warmup._time_gemv_rows(TwoLayers(KernelChoice()), L2)
    assert "not timed" in caplog.text and gemv_rows._choices == {}

"""enable_pdl, the engine argument, reaches everything the worker builds that launches Triton kernels: the target's
layers, a draft model's, an EAGLE or Medusa head's (KernelChoice.pdl), and the triton attention backend."""
from __future__ import annotations

import pytest
from torch import nn

import lamina
from lamina import LLM
from lamina.config import KernelChoice, engine_config

SPECS = {"draft_model": lamina.DEMO_DRAFT, "eagle": lamina.DEMO_EAGLE, "medusa": lamina.DEMO_MEDUSA}


def _pdl_choices(module: nn.Module) -> set[bool]:
    return {m.kernels.pdl for m in module.modules() if isinstance(getattr(m, "kernels", None), KernelChoice)}


@pytest.mark.parametrize("method", sorted(SPECS))
def test_enable_pdl_false_reaches_the_target_and_the_proposer(method: str) -> None:
    spec = {"method": method, "model": SPECS[method], "num_speculative_tokens": 2}
    llm = LLM(lamina.DEMO_MODEL, device="cpu", num_kv_blocks=32, enable_pdl=False, speculative_config=spec)
    worker = llm.engine.executor.worker
    proposer = worker.runner.drafter.proposer
    drafter = {"draft_model": "model", "eagle": "head", "medusa": "heads"}[method]
    assert _pdl_choices(worker.model) == {False}
    assert _pdl_choices(getattr(proposer, drafter)) == {False}
    llm.engine.check_integrity()


def test_enable_pdl_is_on_by_default_and_validated() -> None:
    assert engine_config(model=lamina.DEMO_MODEL).enable_pdl is True
    with pytest.raises(ValueError, match="enable_pdl: must be a bool"):
        engine_config(model=lamina.DEMO_MODEL, enable_pdl="no")
    llm = LLM(lamina.DEMO_MODEL, device="cpu", num_kv_blocks=32)
    assert _pdl_choices(llm.engine.executor.worker.model) == {True}


def test_the_triton_backend_takes_the_choice() -> None:
    pytest.importorskip("triton", reason="triton is not installed (CI installs it with the test extra)")
    from lamina.attention.backends import get_attention_backend
    assert get_attention_backend("triton").pdl is True
    assert get_attention_backend("triton", pdl=False).pdl is False

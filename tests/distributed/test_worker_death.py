"""A tensor-parallel worker that dies is a clear error, not a hang; no worker process outlives the engine."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from lamina import LLM, SamplingParams
from lamina.executor.multiproc import WorkerDiedError
from lamina.executor.processes import WorkerProcesses
from lamina.failures import EngineBrokenError
from tests.helpers.tiny_models import make_tiny_model

ENGINE = dict(skip_tokenizer_init=True, block_size=4, num_kv_blocks=32, tensor_parallel_size=2)


def test_killed_worker_raises_instead_of_hanging(tmp_path) -> None:
    path = str(make_tiny_model("llama", tmp_path / "m", num_hidden_layers=1))
    llm = LLM(model=path, **ENGINE)
    procs = llm.engine.executor.procs
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    try:
        assert len(llm.generate([{"prompt_token_ids": [1, 2, 3]}], params, use_tqdm=False)[0].outputs[0].token_ids) == 4
        (pid,) = procs.pids
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        # the engine (and a server) stop, as on a lost GPU
        with pytest.raises(EngineBrokenError, match=r"worker rank 1 \(pid \d+\) died: exit code -9") as info:
            llm.generate([{"prompt_token_ids": [4, 5, 6]}], params, use_tqdm=False)
        assert time.monotonic() - start < 30
        assert isinstance(info.value.__cause__, WorkerDiedError)
    finally:
        llm.shutdown()
    assert all(not c.process.is_alive() for c in procs.children)
    llm.shutdown()  # idempotent


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_worker_failing_at_start_sends_its_traceback() -> None:
    """A spawned worker that fails before joining (here: it is told to use a GPU this machine lacks) ends the
    start-up at once with its exit code and traceback; rank 0 does not wait for it."""
    procs = WorkerProcesses()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)worker rank 1 \(pid \d+\) died: exit code 1.*traceback.*cuda"):
        procs.start(2, "cuda")
    assert time.monotonic() - start < 60
    procs.stop()
    assert not procs.children[0].process.is_alive()


def test_tensor_parallel_size_is_checked_before_any_process_starts(tmp_path) -> None:
    path = str(make_tiny_model("llama", tmp_path / "m", num_hidden_layers=1))  # 4 heads, 2 KV heads
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 3 does not divide the model's num_attention_heads"):
        LLM(model=path, skip_tokenizer_init=True, tensor_parallel_size=3)
    with pytest.raises(NotImplementedError, match=r"tensor_parallel_size: 2 with speculative_config method "
                                                  r"'early_exit' is not supported yet"):
        LLM(model=path, skip_tokenizer_init=True, tensor_parallel_size=2,
            speculative_config={"method": "early_exit"})
    with pytest.raises(ValueError, match=r"tensor_parallel_size: must be an integer >= 1, got 0"):
        LLM(model=path, skip_tokenizer_init=True, tensor_parallel_size=0)

"""The worker's copies of its requests (BatchState) stay equal to the engine's requests through the step
messages alone: chunked prefill, preemption, the prefix cache, n > 1, penalties and async scheduling."""
from __future__ import annotations

import pytest

from lamina import LLM, SamplingParams
from lamina.engine.engine import LLMEngine
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer

PROMPTS = ["def f(x):", "for i in range(3):", "a = [1, 2,", "print(", "class A:", "x", "def f(x):"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = make_tiny_model("qwen3", tmp_path_factory.mktemp("copies"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return str(path)


def assert_copies_match(engine: LLMEngine) -> int:
    """Every running request: the worker holds the same tokens and counters, and (prefix cache off) the same
    block table. Returns how many were compared."""
    states = engine.executor.worker.runner.states
    for request in engine.scheduler.running:
        state = states[request.request_id]
        assert state.token_ids == request.all_token_ids, request.request_id
        assert state.sampling_params is request.sampling_params
        if not engine.kv_manager.enable_prefix_caching:
            assert state.block_ids == engine.kv_manager.block_ids(request.request_id), request.request_id
    held = set(states.requests)
    assert {r.request_id for r in engine.scheduler.running} <= held
    return len(engine.scheduler.running)


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_worker_copies_follow_the_engine(model_dir: str, prefix_caching: bool, async_scheduling: bool) -> None:
    # 40 blocks of 4 tokens for 7 requests of up to ~40 tokens: preemption; a 16-token budget: chunked prefill
    llm = LLM(model=model_dir, block_size=4, num_kv_blocks=40, max_model_len=64, max_num_batched_tokens=16,
              enable_prefix_caching=prefix_caching, async_scheduling=async_scheduling)
    engine = llm.engine
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=25, ignore_eos=True, n=2),
              SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.3, frequency_penalty=0.5),
              SamplingParams(temperature=0.7, max_tokens=28, presence_penalty=0.8, ignore_eos=True)]
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(prompt, params[i % len(params)])
    compared = steps = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            assert all(o.finish_reason != "error" for o in output.outputs), output.extra  # no step failed
        compared += assert_copies_match(engine)
        steps += 1
    assert compared > 50 and engine.get_stats().num_preemptions > 0
    engine.step()  # the last finished ids reach the worker with the next (empty) message
    assert len(engine.executor.worker.runner.states) == 0
    engine.check_integrity()

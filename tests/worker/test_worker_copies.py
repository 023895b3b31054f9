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


def check_block_tables_on_apply(engine: LLMEngine) -> list[int]:
    """After the worker applies each message, its block tables equal the KV manager's for every request of the
    step (nothing changes them in between; later commits may swap a block, which the next message carries).
    Returns a list that counts the checks."""
    states, kv, checked = engine.executor.worker.runner.states, engine.kv_manager, []
    apply = states.apply

    def apply_and_check(scheduled):  # noqa: ANN001, ANN202 - wraps this test's instance only
        apply(scheduled)
        for req_id in scheduled.req_ids:
            assert states[req_id].block_ids == kv.block_ids(req_id), req_id
            checked.append(1)

    states.apply = apply_and_check
    return checked


def assert_copies_match(engine: LLMEngine) -> int:
    """Every running request: the worker holds the same tokens and counters. Returns how many were compared."""
    states = engine.executor.worker.runner.states
    for request in engine.scheduler.running:
        state = states[request.request_id]
        assert state.token_ids == request.all_token_ids, request.request_id
        assert state.sampling_params is request.sampling_params
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
    checked = check_block_tables_on_apply(engine)
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
    assert compared > 50 and len(checked) > 50 and engine.get_stats().num_preemptions > 0
    engine.step()  # the last finished ids reach the worker with the next (empty) message
    assert len(engine.executor.worker.runner.states) == 0
    engine.check_integrity()

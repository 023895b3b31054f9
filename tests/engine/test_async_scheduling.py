"""Async scheduling (the next decode step launched before this step's tokens reach the host) gives the
same tokens, texts and finish reasons as one step at a time, and leaks no KV block."""
from __future__ import annotations

import pytest

from lamina import LLM, SamplingParams
from lamina.engine.engine import LLMEngine
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer

PROMPTS = ["def f(x):", "for i in range(3):", "a = [1, 2,", "print(", "class A:", "x"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = make_tiny_model("qwen3", tmp_path_factory.mktemp("async"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return str(path)


def make_llm(model_dir: str, async_scheduling: bool) -> LLM:
    return LLM(model=model_dir, block_size=4, num_kv_blocks=96, max_model_len=64, max_num_batched_tokens=32,
               async_scheduling=async_scheduling)


def count_ahead_steps(engine: LLMEngine) -> list[int]:
    """Wrap schedule_ahead: the sizes of the steps it scheduled."""
    sizes: list[int] = []
    original = engine.scheduler.schedule_ahead

    def counted(inflight):  # noqa: ANN001, ANN202
        ahead = original(inflight)
        if ahead is not None:
            sizes.append(len(ahead.req_ids))
        return ahead

    engine.scheduler.schedule_ahead = counted
    return sizes


def generate(llm: LLM, params: list[SamplingParams]) -> list[tuple]:
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    llm.engine.check_integrity()
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].stop_reason)
            for o in outs]


def test_same_outputs_as_one_step_at_a_time_with_every_kind_of_stop(model_dir: str) -> None:
    sync, fast = make_llm(model_dir, False), make_llm(model_dir, True)
    base = [SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True) for i in range(len(PROMPTS))]
    plain = generate(sync, base)
    # stop on tokens and strings that the greedy outputs really contain, at different steps
    tokens_0, tokens_2 = plain[0][0], plain[2][0]
    text_4 = plain[4][1]
    params = list(base)
    params[0] = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[tokens_0[3]])
    params[2] = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[tokens_2[1]], ignore_eos=True)
    params[4] = SamplingParams(temperature=0, max_tokens=20, stop=[text_4[2:4]], ignore_eos=True)
    params[5] = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True, logprobs=2)
    expected = generate(sync, params)
    assert expected[0][2] == expected[2][2] == expected[4][2] == "stop"
    ahead_sizes = count_ahead_steps(fast.engine)
    assert generate(fast, params) == expected
    assert len(ahead_sizes) > 10 and max(ahead_sizes) == len(PROMPTS)  # it did run ahead, on the whole batch
    assert generate(fast, base) == plain  # and again, on the same engine


def test_penalties_and_admissions_run_one_step_at_a_time(model_dir: str) -> None:
    fast = make_llm(model_dir, True)
    ahead_sizes = count_ahead_steps(fast.engine)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, frequency_penalty=0.5)
    expected = generate(make_llm(model_dir, False), [params] * len(PROMPTS))
    assert generate(fast, [params] * len(PROMPTS)) == expected
    assert ahead_sizes == []


def test_abort_while_a_step_runs_ahead(model_dir: str) -> None:
    engine = make_llm(model_dir, True).engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("def f(x):", params, request_id="keep")
    engine.add_request("print(", params, request_id="drop")
    for _ in range(4):
        engine.step()
    assert engine._inflight is not None  # a step is running ahead
    assert engine.abort_request("drop").outputs[0].finish_reason == "abort"
    last = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            last[out.request_id] = out
    assert set(last) == {"keep"} and len(last["keep"].outputs[0].token_ids) == 30
    assert engine._inflight is None
    engine.check_integrity()


def test_parallel_samples_and_prefix_hits_run_ahead_too(model_dir: str) -> None:
    shared = "def common_prefix(a, b, c):\n    return"
    prompts = [shared + " a", shared + " b", shared + " c"]
    params = SamplingParams(temperature=0.7, seed=3, n=2, max_tokens=10, ignore_eos=True)
    results = {}
    for async_scheduling in (False, True):
        llm = make_llm(model_dir, async_scheduling)
        sizes = count_ahead_steps(llm.engine)
        outs = llm.generate(prompts, params, use_tqdm=False)
        llm.engine.check_integrity()
        assert sum(o.num_cached_tokens for o in outs) > 0  # the shared prefix hit the cache
        results[async_scheduling] = [[c.token_ids for c in o.outputs] for o in outs]
        assert bool(sizes) == async_scheduling
    assert results[True] == results[False]

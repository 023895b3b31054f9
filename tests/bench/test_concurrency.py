"""The closed loop at a fixed concurrency: the batch stays full until the queue is dry; every token counted."""
from __future__ import annotations

import pytest

from lamina import LLM
from lamina.bench.concurrency import closed_loop_requests, steady_throughput
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer


def test_closed_loop_requests_are_the_same_list_for_every_engine() -> None:
    first, again = (closed_loop_requests(["a", "b", "c"], 9, 20, 0.6) for _ in range(2))
    assert [p for p, _ in first] == ["a", "b", "c"] * 3
    lengths = [params.max_tokens for _, params in first]
    assert lengths == [params.max_tokens for _, params in again] and all(10 <= n <= 30 for n in lengths)
    assert len(set(lengths)) > 1 and all(params.ignore_eos and params.temperature == 0.6 for _, params in first)


def test_the_batch_stays_full_until_the_queue_is_dry(tmp_path) -> None:
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    save_tiny_tokenizer(model, vocab_size=300)
    llm = LLM(model=str(model), num_kv_blocks=128)
    requests = closed_loop_requests(["hello there", "a b c d"], 8, 12, 0.6)
    llm.engine.step_log = []
    tokens, seconds = steady_throughput(llm.engine, requests, concurrency=3)
    steps = [(step.num_rows, step.kind) for step in llm.engine.step_log]
    # full, but for a step launched ahead before the successors of the requests that just ended were added: the
    # step after it admits them
    assert seconds > 0 and steps[0] == (3, "prefill") and sum(n == 3 for n, _ in steps) > 0.7 * len(steps)
    assert all(after == (3, "prefill") for (n, _), after in zip(steps, steps[1:]) if n < 3)
    # every request but the last two in flight ended; the tokens are theirs plus the in-flight ones' so far
    ended = sum(params.max_tokens for _, params in requests[:-2])
    assert ended - sum(params.max_tokens for _, params in requests[-3:]) < tokens
    assert tokens <= sum(params.max_tokens for _, params in requests)
    assert not llm.engine.has_unfinished_requests()
    llm.engine.check_integrity()


@pytest.mark.parametrize("concurrency", [0, 8])
def test_a_concurrency_that_leaves_no_queue_is_refused(tmp_path, concurrency: int) -> None:
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    llm = LLM(model=str(model), num_kv_blocks=64, skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="concurrency"):
        steady_throughput(llm.engine, closed_loop_requests([[1, 2, 3]], 8, 4, 0.0), concurrency)

"""LLMEngine's step API: streaming outputs, abort, statistics."""
from __future__ import annotations

import pytest

from lamina import LLM, RequestOutputKind, SamplingParams
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_tiny_model("llama", tmp_path_factory.mktemp("engine"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return LLM(model=str(path), block_size=4, num_kv_blocks=64, max_model_len=128,
               max_num_batched_tokens=16).engine


def drain(engine) -> dict:
    last = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            last[out.request_id] = out
    engine.check_integrity()
    return last


def test_streamed_text_only_grows_and_ends_with_the_full_text(engine):
    engine.add_request("for i in range(10):", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                             stop=["zzzz"]), request_id="s")
    texts = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts.append(out.outputs[0].text)
    assert out.finished and texts[-1] == engine.tokenizer.decode(out.outputs[0].token_ids)
    for before, after in zip(texts, texts[1:]):
        assert after.startswith(before)
    engine.check_integrity()


def test_a_request_that_does_not_stream_has_one_output_when_it_finishes(engine):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, stop=["zzzz"])
    engine.add_request("print(", params.with_output_kind(RequestOutputKind.FINAL_ONLY), request_id="quiet")
    engine.add_request("print(", params, request_id="loud")
    outputs = {"quiet": [], "loud": []}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].append(out)
    quiet, loud = outputs["quiet"], outputs["loud"]
    assert len(quiet) == 1 and quiet[0].finished and len(loud) == 6
    assert quiet[0].outputs[0].token_ids == loud[-1].outputs[0].token_ids
    assert quiet[0].outputs[0].text == loud[-1].outputs[0].text != ""
    engine.check_integrity()


def test_abort_frees_blocks_and_reports_abort(engine):
    engine.add_request({"prompt_token_ids": list(range(1, 30))}, SamplingParams(max_tokens=50, ignore_eos=True),
                       request_id="a")
    engine.add_request({"prompt_token_ids": list(range(2, 9))}, SamplingParams(max_tokens=5, ignore_eos=True),
                       request_id="b")
    for _ in range(3):
        engine.step()
    assert engine.get_stats().kv_blocks_used > 0
    out = engine.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    last = drain(engine)
    assert last["b"].outputs[0].finish_reason == "length"
    assert engine.abort_request("a") is None  # unknown now: nothing to do
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("x", request_id="c")
        engine.add_request("y", request_id="c")
    drain(engine)


def test_statistics_follow_the_run(engine):
    before = engine.get_stats().num_steps
    for i in range(5):
        engine.add_request({"prompt_token_ids": [7 + i] * 20}, SamplingParams(max_tokens=3, ignore_eos=True))
    stats = engine.get_stats()
    assert stats.num_waiting == 5 and stats.num_running == 0
    engine.step()
    stats = engine.get_stats()
    assert stats.last_step_tokens == 16  # the token budget, filled by a chunked prefill
    assert stats.num_running >= 1 and 0 < stats.kv_usage <= 1
    assert stats.kv_blocks_used + stats.kv_blocks_free == 63
    last = drain(engine)
    stats = engine.get_stats()
    assert stats.num_running == stats.num_waiting == 0 and stats.kv_usage == 0
    assert stats.num_steps > before and stats.mean_tokens_per_step > 0
    for out in last.values():
        m = out.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
        assert m.num_generation_tokens == 3 and m.tpot is not None and m.tpot >= 0
        assert m.ttft == m.first_token_time - m.arrival_time


def test_step_log_records_each_step_only_while_on(engine):
    assert engine.step_log is None  # off by default: a long-running server keeps no per-step list
    engine.step_log = steps = []
    engine.add_request("import sys; print(sys.argv)", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                       request_id="logged")  # a prompt no other test sends: no prefix-cache hit
    prompt_len = len(drain(engine)["logged"].prompt_token_ids)
    engine.step_log = None
    kinds = [s.kind for s in steps]
    prefills = next(i for i, kind in enumerate(kinds) if kind != "prefill")  # the prompt in 16-token chunks
    assert prefills >= 1 and all(s.num_tokens > s.num_rows == 1 for s in steps[:prefills])
    assert all(s.kind in ("decode", "decode ahead") and s.num_tokens == s.num_rows for s in steps[prefills:])
    assert any(s.kind == "decode ahead" for s in steps)  # async scheduling is on by default
    assert all(0 <= s.device_wait_s <= s.seconds for s in steps)
    assert sum(s.num_tokens for s in steps) >= prompt_len + 5  # the prompt, then 5 of the 6 tokens fed back


def test_the_start_up_heap_is_frozen_out_of_the_garbage_collector(tmp_path) -> None:
    """A full collection walks only what serving allocated: the objects alive after start-up (the engine's own
    included) are in the permanent generation."""
    import gc

    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    gc.unfreeze()
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=16)
    frozen = gc.get_freeze_count()
    assert frozen > 1000 and not any(o is llm.engine for o in gc.get_objects())
    gc.unfreeze()

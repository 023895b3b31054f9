"""Failure isolation in LLMEngine (issue 10): a step that raises ends its requests with finish_reason
"error" and frees their blocks; one row's sampling failure ends that request only; any integer is a seed;
a lost device or repeated failures raise EngineBrokenError. Faults are injected on this test's instances."""
from __future__ import annotations

import pytest
import torch

from lamina import LLM, RequestOutputKind, SamplingParams
from lamina.failures import MAX_FAILED_STEPS, EngineBrokenError, is_fatal
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
MARKED = 0.77  # the temperature of the request the fake sampler fails on


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path = make_tiny_model("llama", tmp_path_factory.mktemp("faults"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return LLM(model=str(path), block_size=4, num_kv_blocks=64, max_model_len=128)


def drain(engine) -> dict:
    last = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            last[out.request_id] = out
    return last


def _sampled(llm: LLM, params: SamplingParams) -> list[list[int]]:
    return [c.token_ids for c in llm.generate("def add(a, b):", params, use_tqdm=False)[0].outputs]


def test_a_seed_outside_int64_is_a_value_error_naming_it_and_the_engine_goes_on(llm: LLM) -> None:
    """Reproducer 1: a seed of 2**64 used to raise inside the step and leave the engine unusable."""
    for seed in (18446744073709551616, 2**63, -(2**63) - 1):
        with pytest.raises(ValueError, match="seed"):
            llm.generate("def add(a, b):", SamplingParams(temperature=1.0, max_tokens=8, seed=seed),
                         use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    llm.engine.check_integrity()
    assert llm.generate("x", GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_the_runner_takes_any_integer_seed_mod_2_64(llm: LLM) -> None:
    """Defence in depth: whatever seed reaches the runner, its generator gets `seed mod 2**64` (the key
    of the CUDA sampling kernel too), which for every valid seed is the generator it always had."""
    def params(seed: int, n: int = 1) -> SamplingParams:
        return SamplingParams(temperature=1.0, max_tokens=8, seed=seed, n=n, ignore_eos=True)

    unchecked = params(0).with_output_kind(RequestOutputKind.FINAL_ONLY)
    object.__setattr__(unchecked, "seed", 2**64)  # past validation, as a future path might let it
    llm.engine.add_request("def add(a, b):", unchecked, request_id="unchecked")
    assert drain(llm.engine)["unchecked"].outputs[0].token_ids == _sampled(llm, params(0))[0]
    assert _sampled(llm, params(-1)) != _sampled(llm, params(0))
    two = _sampled(llm, params(2**63 - 1, n=2))  # sample 1's seed steps past the int64 range
    assert two == [_sampled(llm, params(2**63 - 1))[0], _sampled(llm, params(-(2**63)))[0]]
    llm.engine.check_integrity()


def test_a_forward_that_raises_mid_batch_fails_that_step_only(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, runner = llm.engine, llm.engine.executor.worker.runner
    reference = llm.generate("class Point:", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    engine.add_request("def add(a, b):", GREEDY, request_id="a")
    engine.add_request("import os", SamplingParams(temperature=0, max_tokens=8, n=2, ignore_eos=True),
                       request_id="b")
    engine.step()
    engine.step()  # both decoding
    forward = runner._forward

    def out_of_memory(*args: object) -> torch.Tensor:
        monkeypatch.setattr(runner, "_forward", forward)  # fails once
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(runner, "_forward", out_of_memory)
    outputs = {o.request_id: o for o in engine.step()}
    assert set(outputs) == {"a", "b"}
    for out in outputs.values():
        assert out.finished and {c.finish_reason for c in out.outputs} == {"error"}
        assert "OutOfMemoryError" in out.extra["error"]
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    assert engine.get_stats().kv_usage == 0.0
    after = llm.generate("class Point:", GREEDY, use_tqdm=False)[0].outputs[0]  # the engine goes on
    assert after.token_ids == reference and after.finish_reason == "length"
    engine.check_integrity()


def _failing_sampler(sampler):
    def sample(logits: torch.Tensor, metadata, argmax=None):
        temps = metadata.temperature
        if temps is not None and bool(((temps - MARKED).abs() < 1e-4).any()):
            raise ValueError("probability tensor contains nan (simulated)")
        return sampler(logits, metadata, argmax=argmax)
    return sample


def test_a_sampler_that_raises_for_one_row_fails_that_request_only(llm: LLM,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    engine, runner = llm.engine, llm.engine.executor.worker.runner
    prompts = ["def add(a, b):", "class Point:", "import os"]
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    monkeypatch.setattr(runner, "sampler", _failing_sampler(runner.sampler))
    bad = SamplingParams(temperature=MARKED, max_tokens=8, n=2, ignore_eos=True)
    engine.add_request(prompts[0], GREEDY, request_id="g0")
    engine.add_request("while True:", bad, request_id="bad")
    engine.add_request(prompts[1], GREEDY, request_id="g1")
    engine.add_request(prompts[2], GREEDY, request_id="g2")
    outputs = drain(engine)
    assert [c.finish_reason for c in outputs["bad"].outputs] == ["error", "error"]
    assert "sampling failed" in outputs["bad"].extra["error"]
    assert [outputs[f"g{i}"].outputs[0].token_ids for i in range(3)] == expected
    assert all(outputs[f"g{i}"].outputs[0].finish_reason == "length" for i in range(3))
    engine.check_integrity()


def test_the_python_api_returns_error_outputs_and_keeps_working(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = llm.engine.executor.worker.runner
    monkeypatch.setattr(runner, "sampler", _failing_sampler(runner.sampler))
    params = [GREEDY, SamplingParams(temperature=MARKED, max_tokens=4)]
    good, bad = llm.generate(["print(", "print("], params, use_tqdm=False)
    assert good.outputs[0].finish_reason == "length" and bad.outputs[0].finish_reason == "error"
    llm.engine.check_integrity()


def test_repeated_step_failures_break_the_engine_after_failing_their_requests(
        llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = llm.engine

    def broken(*args: object) -> torch.Tensor:
        raise RuntimeError("kernel failed (simulated)")

    monkeypatch.setattr(engine.executor.worker.runner, "_forward", broken)
    for i in range(MAX_FAILED_STEPS - 1):
        engine.add_request("x", GREEDY, request_id=f"r{i}")
        assert engine.step()[0].outputs[0].finish_reason == "error"
    engine.add_request("x", GREEDY, request_id="last")
    with pytest.raises(EngineBrokenError, match="steps failed in a row"):
        engine.step()
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    monkeypatch.undo()
    engine._failed_steps = 0  # the next successful step would reset it too
    assert llm.generate("x", GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"


def test_a_lost_device_breaks_the_engine_at_once(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(*args: object) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(llm.engine.executor.worker.runner, "_forward", lost)
    llm.engine.add_request("x", GREEDY, request_id="lost")
    with pytest.raises(EngineBrokenError, match="device failed"):
        llm.engine.step()
    llm.engine.check_integrity()
    llm.engine._failed_steps = 0


def test_which_errors_are_fatal() -> None:
    assert not is_fatal(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_fatal(ValueError("bad row")) and not is_fatal(RuntimeError("shape mismatch"))
    assert is_fatal(RuntimeError("CUDA error: device-side assert triggered"))
    assert is_fatal(EngineBrokenError("x")) and is_fatal(KeyboardInterrupt())


def test_a_failure_building_outputs_loses_no_finished_request(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building one group's output raises after another group of the same step has finished: the step
    fails, and every request of it still ends with an output (none finishes unseen, none hangs)."""
    engine, processor = llm.engine, llm.engine.output_processor
    engine.add_request("def add(a, b):", SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
                       request_id="short")
    engine.add_request("import os", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                       request_id="long")
    make_output = processor._make_output

    def failing(group, *args):  # noqa: ANN001, ANN202 - the processor's own signature
        if group.request_id == "long":
            monkeypatch.setattr(processor, "_make_output", make_output)  # fails once
            raise RuntimeError("decoding failed (simulated)")
        return make_output(group, *args)

    monkeypatch.setattr(processor, "_make_output", failing)
    outputs = {o.request_id: o for o in engine.step()}  # "short" finishes in this step, "long" fails it
    assert outputs["short"].finished and outputs["long"].outputs[0].finish_reason == "error"
    short = outputs["short"].outputs[0]  # it had finished before the failure: its result stands
    assert (short.finish_reason, len(short.token_ids)) == ("length", 1)
    assert not engine.has_unfinished_requests()
    engine.check_integrity()

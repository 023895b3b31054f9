"""Speculative decoding (n-gram drafts) in the engine: greedy output is token-identical to the engine without
it, under chunked prefill, the prefix cache on and off, preemption, n > 1, stops inside an accepted run and
max_tokens mid-run; drafts are really proposed and accepted; no KV block leaks."""
from __future__ import annotations

import pytest

from lamina import LLM, SamplingParams
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer

# Repetitive prompts, so that prompt lookup finds drafts (a tiny random model also repeats itself).
PROMPTS = ["def f(x): return x + 1\ndef f(x): return", "a = [1, 2, 3, 1, 2, 3, 1, 2", "print(", "x",
           "for i in range(3):\n    for i in range(", "class A:\n    pass\nclass B:\n    pass\nclass"]
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "adaptive": False}  # drafts always


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = make_tiny_model("qwen3", tmp_path_factory.mktemp("spec"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return str(path)


def run(model_dir: str, params: list[SamplingParams] | SamplingParams, spec: bool, min_preemptions: int = 0,
        **engine) -> list:
    engine = {"block_size": 4, "num_kv_blocks": 200, "max_model_len": 128, **engine}
    llm = LLM(model=model_dir, speculative_config=SPEC if spec else None, **engine)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    llm.engine.check_integrity()
    stats = llm.engine.get_stats()
    assert stats.num_preemptions >= min_preemptions
    if spec:
        assert stats.spec.num_accepted_tokens > 0 and stats.spec.num_draft_tokens > stats.spec.num_accepted_tokens
        assert stats.spec.draft_seconds > 0 and stats.spec.verify_seconds > 0
        # per request (n > 1: the metrics of sample 0 only), never more than the engine's counts
        assert 0 < sum(o.metrics.num_accepted_tokens for o in outputs) <= stats.spec.num_accepted_tokens
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outputs]


GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.mark.parametrize("engine", [
    {},
    {"enable_prefix_caching": False},
    {"max_num_batched_tokens": 8},  # chunked prefill; drafts cut to the step's budget
    {"num_kv_blocks": 40, "max_num_batched_tokens": 16, "min_preemptions": 1},
], ids=["default", "no-prefix-cache", "chunked", "preemption"])
def test_greedy_output_is_identical_to_no_speculation(model_dir: str, engine: dict) -> None:
    assert run(model_dir, GREEDY, True, **engine) == run(model_dir, GREEDY, False, **engine)


def test_stops_and_max_tokens_inside_an_accepted_run(model_dir: str) -> None:
    """Stop ids, stop strings, EOS and max_tokens that fall among accepted drafts end the request there: the
    tokens after them are not in the output (as without speculation)."""
    plain = run(model_dir, GREEDY, False)
    params = []
    for i, outputs in enumerate(plain):
        tokens, text = outputs[0][0], outputs[0][1]
        kind = i % 4
        if kind == 0:
            params.append(SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[tokens[17]]))
        elif kind == 1:
            params.append(SamplingParams(temperature=0, max_tokens=40, stop=[text[9:12]], ignore_eos=True))
        elif kind == 2:
            params.append(SamplingParams(temperature=0, max_tokens=13, ignore_eos=True))  # mid-run
        else:
            params.append(SamplingParams(temperature=0, max_tokens=40, min_tokens=2))  # no drafts below min_tokens
    assert run(model_dir, params, True) == run(model_dir, params, False)


def test_n_samples_and_logprobs(model_dir: str) -> None:
    """n > 1 greedy samples are identical; requests asking for logprobs speculate too and get the logprobs of
    every token from its verify row: the same as without drafts."""
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, n=2),
              SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2)] * 3
    assert run(model_dir, params, True) == run(model_dir, params, False)
    kwargs = {"block_size": 4, "num_kv_blocks": 200, "max_model_len": 128}
    wanted = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2)
    plain = LLM(model=model_dir, **kwargs).generate(PROMPTS, wanted, use_tqdm=False)
    spec = LLM(model=model_dir, speculative_config=SPEC, **kwargs).generate(PROMPTS, wanted, use_tqdm=False)
    assert sum(o.metrics.num_accepted_tokens for o in spec) > 0
    for a, b in zip(plain, spec):
        first, second = a.outputs[0], b.outputs[0]
        assert first.token_ids == second.token_ids and len(second.logprobs) == len(second.token_ids)
        assert first.cumulative_logprob == pytest.approx(second.cumulative_logprob, abs=1e-4)
        for x, y in zip(first.logprobs, second.logprobs):
            assert x.keys() == y.keys()
            for token in x:
                assert x[token].rank == y[token].rank and x[token].logprob == pytest.approx(y[token].logprob, abs=1e-4)


def test_a_seeded_request_follows_its_seed_not_the_engine_seed(model_dir: str) -> None:
    """Seeded: the same tokens under two engine seeds (its own generator draws every random number of its verify
    steps); unseeded: different (so the comparison can fail)."""
    seeded = SamplingParams(temperature=0.3, top_p=0.9, seed=7, max_tokens=30, ignore_eos=True)
    assert run(model_dir, seeded, True, seed=1) == run(model_dir, seeded, True, seed=2)
    unseeded = SamplingParams(temperature=0.3, top_p=0.9, max_tokens=30, ignore_eos=True)
    assert run(model_dir, unseeded, True, seed=1) != run(model_dir, unseeded, True, seed=2)


def test_a_seeded_request_gets_the_same_tokens_alone_and_in_a_batch(model_dir: str) -> None:
    """Its verify steps draw from a generator keyed by its seed and token position (with a budget that never
    cuts its drafts: a cut changes how many numbers a step draws)."""
    seeded = SamplingParams(temperature=0.3, seed=11, max_tokens=30, ignore_eos=True)
    llm = LLM(model=model_dir, block_size=4, num_kv_blocks=200, max_model_len=128, speculative_config=SPEC)
    alone = llm.generate([PROMPTS[1]], seeded, use_tqdm=False)[0].outputs[0].token_ids
    batch = [GREEDY, seeded, GREEDY, GREEDY, SamplingParams(temperature=1.0, max_tokens=20)]
    mixed = llm.generate(PROMPTS[:5], batch, use_tqdm=False)[1]
    assert llm.engine.get_stats().spec.num_accepted_tokens > 0
    assert mixed.outputs[0].token_ids == alone
    llm.engine.check_integrity()


def test_bad_speculative_config_names_the_field(model_dir: str) -> None:
    for bad, field in [({"method": "eagle"}, "method"), ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
                       ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_max"),
                       ({"k": 2}, "speculative_config"), ("{not json", "speculative_config")]:
        with pytest.raises(ValueError, match=field):
            LLM(model=model_dir, speculative_config=bad)


def test_a_stop_string_inside_an_accepted_run_drops_the_tokens_after_it(model_dir: str) -> None:
    """Swept over the text: several stops land inside a run of accepted drafts (a regression: the tokens
    accepted after the stop stayed in token_ids)."""
    kwargs = {"block_size": 4, "num_kv_blocks": 200, "max_model_len": 128}
    plain, spec = LLM(model=model_dir, **kwargs), LLM(model=model_dir, speculative_config=SPEC, **kwargs)
    texts = [o.outputs[0].text for o in plain.generate(PROMPTS[:3], GREEDY, use_tqdm=False)]
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[text[s:s + 3]])
              for text in texts for s in range(2, min(len(text) - 3, 45), 3)]
    prompts = [p for p, text in zip(PROMPTS[:3], texts) for s in range(2, min(len(text) - 3, 45), 3)]
    want = [(o.outputs[0].token_ids, o.outputs[0].text) for o in plain.generate(prompts, params, use_tqdm=False)]
    got = [(o.outputs[0].token_ids, o.outputs[0].text) for o in spec.generate(prompts, params, use_tqdm=False)]
    assert got == want and len(got) > 20
    spec.engine.check_integrity()


def test_a_failing_row_of_a_verify_step_fails_its_request_only(model_dir: str) -> None:
    """Faults injected on this test's runner: a plain row whose sampling raises fails that request only, and
    sampling that raises on the drafting requests' rows fails those requests only; the engine goes on and leaks
    no block."""
    kwargs = {"block_size": 4, "num_kv_blocks": 200, "max_model_len": 128}
    penalised = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, presence_penalty=0.5)  # no drafts
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, **kwargs).generate(PROMPTS[:2], [GREEDY, penalised],
                                                                                     use_tqdm=False)]
    llm = LLM(model=model_dir, speculative_config=SPEC, **kwargs)
    runner = llm.engine.executor.worker.runner
    sampler = runner.sampler

    def failing_sampler(logits, metadata, argmax=None):  # noqa: ANN001, ANN202
        if metadata.penalties is not None:  # the penalised request's row
            raise ValueError("probability tensor contains nan (simulated)")
        return sampler(logits, metadata, argmax=argmax)

    runner.sampler = failing_sampler
    bad = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, presence_penalty=0.4)
    out = llm.generate(PROMPTS[:2], [GREEDY, bad], use_tqdm=False)
    assert out[0].outputs[0].token_ids == want[0] and out[0].metrics.num_accepted_tokens > 0
    assert out[1].outputs[0].finish_reason == "error" and "sampling failed" in out[1].extra["error"]
    runner.sampler = sampler

    def failing_verifier(logits, metadata, argmax=None):  # noqa: ANN001, ANN202
        if metadata.penalties is None and logits.shape[0] > 1:  # the drafting request's k + 1 rows
            raise ValueError("verifier failed (simulated)")
        return sampler(logits, metadata, argmax=argmax)

    runner.sampler = failing_verifier
    out = llm.generate(PROMPTS[:2], [GREEDY, penalised], use_tqdm=False)
    assert out[0].outputs[0].finish_reason == "error" and "verifying drafts failed" in out[0].extra["error"]
    assert out[1].outputs[0].token_ids == want[1]
    runner.sampler = sampler
    assert llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == want[0]  # goes on
    llm.engine.check_integrity()


def test_the_adaptive_default_is_exact_and_decides_every_step(model_dir: str) -> None:
    """adaptive=True (the default): the policy picks the drafts each step from measured step times; whatever
    it picks, greedy output is unchanged."""
    want = run(model_dir, GREEDY, False)
    llm = LLM(model=model_dir, speculative_config={"method": "ngram", "prompt_lookup_max": 3}, block_size=4,
              num_kv_blocks=200, max_model_len=128)
    got = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in got] == want
    spec = llm.engine.get_stats().spec
    assert spec.policy_steps > 0 and spec.policy_eligible >= spec.policy_steps
    llm.engine.check_integrity()


def test_a_seeded_request_samples_the_same_tokens_with_and_without_drafts(model_dir: str) -> None:
    """Every draw of a seeded request is keyed by its seed and the index of the token drawn, and a verify row
    samples the same distribution as a plain step at that index: sampled output is token-identical too."""
    # peaked enough that drafts get accepted under any seeds (10-17 accepted tokens for seeds 0-5, 100-105, 200-205
    # and 300-305 against 0-2 at temperature 0.8, top-k 20), so that verify rows really emit sampled tokens
    seeded = [SamplingParams(temperature=0.5, top_k=5, seed=s, max_tokens=30, ignore_eos=True) for s in range(6)]
    spec = run(model_dir, seeded, True)
    assert spec == run(model_dir, seeded, False)


def test_a_step_without_drafts_is_launched_before_the_outputs_while_no_request_ends(model_dir: str) -> None:
    """With drafts decided every step (k fixed), each step waits for the tokens of the one before; once they are
    read and the speculator has decided, the next step is launched before this step's outputs are made, drafts or
    none, while no request ends (when one does, the caller may add requests first: tests/engine/test_spec_gate.py's
    closed loop). Regression: a step without drafts waited for the outputs, its device idle meanwhile. Every call
    but the last leaves a step in flight."""
    llm = LLM(model=model_dir, speculative_config=SPEC, block_size=4, num_kv_blocks=200, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = LLM(model=model_dir, block_size=4, num_kv_blocks=200, max_model_len=128).generate(
        PROMPTS[1], params, use_tqdm=False)[0].outputs[0].token_ids
    engine = llm.engine
    engine.add_request(PROMPTS[1], params)
    engine.step_log, in_flight, tokens = [], [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = out.outputs[0].token_ids
        in_flight.append(engine._inflight is not None)
    kinds = [s.kind for s in engine.step_log]
    assert tokens == want and "verify" in kinds and "decode" in kinds  # steps with drafts and without
    assert in_flight[:-1] == [True] * (len(in_flight) - 1) and in_flight[-1] is False
    engine.check_integrity()

"""The engine's side of speculative decoding: the pause of the policy's decisions while nobody drafts."""
from __future__ import annotations

import time

from lamina import LLM, SamplingParams
from lamina.engine.spec_gate import MAX_GAP, Arm, BucketState
from tests.helpers.spec_cases import NGRAM_K3, REPEATING, greedy_reference, tiny_llm
from tests.helpers.tiny_models import make_tiny_model


def test_an_engine_whose_drafts_do_not_pay_rarely_decides(tmp_path) -> None:
    """Drafts that are rarely found and rarely accepted (1 of ~18 here): after a step without drafts worth making
    the policy pauses its decisions (1 or 2 steps after a step without a match worth drafting, up to MAX_REST
    where drafts cannot pay), so it decides on about half the steps (57 of 117 measured), where a policy without
    pauses decides on every step. Greedy output is unchanged."""
    model, params, want = greedy_reference(tmp_path, max_tokens=120)
    llm = tiny_llm(model, speculative_config=NGRAM_K3)
    got = llm.generate(REPEATING, params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    stats = llm.engine.get_stats()
    assert stats.spec.num_drafts > 0 and stats.spec.policy_steps < 0.75 * stats.num_steps
    llm.engine.check_integrity()


def test_a_worker_side_proposer_is_asked_again_after_each_pause(tmp_path) -> None:
    """Steps launched ahead during a pause skip before_step; the pause still ends (every processed step counts)
    and the next step waits for its tokens, so the policy decides again: a regression where an ahead chain
    never ended and a draft model was never asked again."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    params = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}]
    want = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64).generate(prompts, params, use_tqdm=False)
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64,
              speculative_config={"method": "draft_model", "model": str(model), "num_speculative_tokens": 2})
    llm.engine.step_log = []
    got = llm.generate(prompts, params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    kinds = [step.kind for step in llm.engine.step_log]
    assert "decode ahead" in kinds and kinds.count("decode") + kinds.count("verify") >= 4  # paused, then asked
    llm.engine.check_integrity()


def test_a_plain_window_costs_a_worker_side_proposer_no_per_step_work(tmp_path) -> None:
    """While the gate runs speculation's plain arm, a draft model's speculator makes no decision and samples no
    step cost (that work was O(rows) a step): with the gate's bucket led by PLAIN from the start, the policy's
    cost model sees only the steps before the first window began, the steps run launched ahead, and the output is
    the plain engine's."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10, 11]}]
    want = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64).generate(prompts, params, use_tqdm=False)
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64,
              speculative_config={"method": "draft_model", "model": str(model), "num_speculative_tokens": 2})
    engine = llm.engine
    engine.speculator.gate.buckets[2, True] = BucketState(leader=Arm.PLAIN, gap=MAX_GAP)  # no probe in 60 steps
    observed: list[float] = []
    observe = engine.speculator.policy.observe_scheduled
    engine.speculator.policy.observe_scheduled = lambda scheduled, seconds: (observed.append(seconds),
                                                                              observe(scheduled, seconds))
    engine.step_log = []
    got = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    kinds = [step.kind for step in engine.step_log]
    assert kinds.count("decode ahead") >= 50 and len(observed) <= 3, (kinds, len(observed))
    assert engine.speculator.policy.steps <= 3  # nor do its estimates age there (no tick)
    engine.check_integrity()


def test_a_worker_side_policys_estimates_age_with_its_steps_without_drafts(tmp_path) -> None:
    """Each step in which a draft model's policy lets nobody draft (verify steps priced out) ages its estimates by
    one step (SpecPolicy.tick), so a request judged on old evidence is tried again (test_spec_policy.py's
    unlucky verify); before, its clock moved only when it drafted, and such a request never drafted again."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64,
              speculative_config={"method": "draft_model", "model": str(model), "num_speculative_tokens": 2})
    engine = llm.engine
    engine.speculator.gate = None  # the policy alone
    policy = engine.speculator.policy
    policy.cost.seed([(2, 1.0), (3, 1.0)])  # a verify step of 1 + 1 or 1 + 2 tokens: a second
    llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], params, use_tqdm=False)
    assert engine.get_stats().spec.num_drafts == 0 and policy.steps >= 35, policy.steps
    engine.check_integrity()


class _SometimesRight:
    """Proposes the true greedy continuation (`truth`) on every third call, and nothing otherwise: a proposer
    whose drafts are all accepted but that often finds no match."""

    def __init__(self, truth: list[int]) -> None:
        self.truth, self.calls = truth, 0

    def propose(self, token_ids, max_drafts):  # noqa: ANN001, ANN201
        self.calls += 1
        if self.calls % 3:
            return [[] for _ in token_ids]
        return [self.truth[len(t):len(t) + n] for t, n in zip(token_ids, max_drafts)]


def test_steps_without_a_match_do_not_pause_a_policy_that_lets_requests_draft(tmp_path) -> None:
    """Where drafts pay (a flat step cost, as on a GPU at batch 1, and every draft accepted), the policy lets the
    request draft every step; a step where the proposer finds no match must not pause it (regression: it paused
    for 1, 2, 4, .. 32 steps after each step without a match: adaptive n-gram verified once in 200 steps where
    k fixed verified 53 times)."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    prompt, params = [5, 6, 7, 8, 9, 10], SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    want = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64).generate(
        [{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0].token_ids
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    engine = llm.engine
    cost = engine.speculator.policy.cost
    cost.seed([(1, 0.02), (4, 0.02), (16, 0.02)])
    cost.observe = lambda num_tokens, seconds: None  # the flat cost stays: this CPU's own timings play no part
    engine.speculator.proposer = _SometimesRight(prompt + list(want))
    engine.speculator.gate = None  # the policy alone: the gate's plain probes would pause it (test_spec_gate.py)
    got = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want
    stats = engine.get_stats()
    assert stats.spec.num_drafts >= 6 and stats.spec.acceptance_rate == 1.0
    assert stats.spec.policy_off_steps == 0 and stats.spec.policy_steps >= 0.9 * (stats.num_steps - 1)
    engine.check_integrity()


def test_a_step_launched_ahead_is_charged_for_its_launch(tmp_path) -> None:
    """A CPU computes a step while launching it; a step launched ahead is launched during the call before its
    own. The time the policy's cost model gets for a step (and step_log's) must include its launch, wherever
    it happened, and not the launch of the next step. Regression: the decision step after each pause had been
    launched ahead, so its cost sample was its own call's ~20 us, and the n-gram policy judged plain decode
    steps free and never drafted (0 verify steps at batch 1 on the demo model, CPU and H200)."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    engine, launches = llm.engine, {}
    execute_model = engine.executor.execute_model

    def timed(scheduled):  # noqa: ANN001, ANN202
        start = time.perf_counter()
        pending = execute_model(scheduled)
        launches[id(scheduled)] = time.perf_counter() - start
        return pending

    engine.executor.execute_model = timed
    observed: list[tuple[float, float]] = []  # (launch seconds, seconds the policy got)
    observe = engine.speculator.policy.observe_scheduled
    engine.speculator.policy.observe_scheduled = lambda scheduled, seconds: (
        observed.append((launches[id(scheduled)], seconds)), observe(scheduled, seconds))
    engine.step_log = []
    llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], SamplingParams(temperature=0, max_tokens=80, ignore_eos=True),
                 use_tqdm=False)
    assert "decode ahead" in [step.kind for step in engine.step_log] and len(observed) >= 5
    assert all(seconds >= launch for launch, seconds in observed)
    assert all(step.seconds >= step.device_wait_s for step in engine.step_log)
    engine.check_integrity()


def test_a_step_with_drafts_is_launched_before_the_outputs_it_follows(tmp_path) -> None:
    """Async scheduling: a verify step cannot be launched ahead (its drafts follow the step before it), but it is
    launched as soon as that step's tokens are known, before their outputs are detokenized and returned, so its
    device work overlaps them. Greedy output is unchanged; without async scheduling the order is the old one."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 5, 6, 7, 5, 6]}]
    want = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64).generate(prompts, params, use_tqdm=False)
    for async_scheduling in (True, False):
        llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64, async_scheduling=async_scheduling,
                  speculative_config={"method": "ngram", "num_speculative_tokens": 3, "adaptive": False})
        engine, events = llm.engine, []
        execute_model, process = engine.executor.execute_model, engine.output_processor.process
        engine.executor.execute_model = lambda scheduled: (
            events.append("verify" if scheduled.scheduled_spec_decode_tokens else "step"), execute_model(scheduled))[1]
        engine.output_processor.process = lambda *args: (events.append("outputs"), process(*args))[1]
        got = llm.generate(prompts, params, use_tqdm=False)
        assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
        # at each verify launch: steps launched whose outputs are not processed yet (the one it follows, or none)
        unprocessed = [events[:i].count("step") + events[:i].count("verify") - events[:i].count("outputs")
                       for i, e in enumerate(events) if e == "verify"]
        assert len(unprocessed) >= 3 and set(unprocessed) == ({1} if async_scheduling else {0})
        assert engine.get_stats().spec.num_accepted_tokens > 0
        engine.check_integrity()


class _SlowProposer:
    """n-gram's drafts, each proposal taking `delay` seconds more."""

    def __init__(self, proposer, delay: float) -> None:  # noqa: ANN001
        self.proposer, self.delay = proposer, delay

    def propose_with_matches(self, token_ids, max_drafts):  # noqa: ANN001, ANN201
        time.sleep(self.delay)
        return self.proposer.propose_with_matches(token_ids, max_drafts)


def test_the_cost_model_gets_a_step_without_the_decision_inside_it(tmp_path) -> None:
    """The decision on the next step's drafts runs inside a step's call (before its outputs); the policy charges
    decisions apart (c_draft), so the step time its cost model gets leaves the decision out: with proposals made
    200 ms slower, the steps the engine logs with a decision take > 200 ms, the times the cost model gets do not
    (a step of the tiny model takes a few ms, tens on a loaded machine)."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    engine = llm.engine
    policy = engine.speculator.policy
    engine.speculator.proposer = _SlowProposer(engine.speculator.proposer, 0.2)
    observed: list[float] = []
    observe = policy.observe_scheduled
    policy.observe_scheduled = lambda scheduled, seconds: (observed.append(seconds), observe(scheduled, seconds))
    engine.step_log = []
    llm.generate([{"prompt_token_ids": [5, 6, 7, 5, 6, 7, 5, 6]}],
                 SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), use_tqdm=False)
    slow = [step.seconds for step in engine.step_log if step.seconds > 0.2]
    assert len(slow) >= 2 and len(observed) >= 2 and max(observed) < 0.2
    engine.check_integrity()

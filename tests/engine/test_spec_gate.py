"""SpecGate: speculation on or off per batch size, by the throughput each arm delivers. Its FULL mode (drafts
without the policy): test_spec_gate_full.py; a draining batch charged by its slowest row: test_spec_gate_drain.py."""
from __future__ import annotations

import math
import random

from lamina import LLM, SamplingParams
from lamina.bench.concurrency import steady_throughput
from lamina.engine.spec_gate import (MAX_GAP, MIN_PROBE_STEPS, SPEC_MARGIN, WINDOW, Arm, BucketState, SpecGate,
                                     batch_bucket)
from tests.helpers.spec_cases import NGRAM_K3, REPEATING, greedy_reference, tiny_llm
from tests.helpers.tiny_models import make_tiny_model


def run(gate: SpecGate, windows: int, rate_of, rows: int = 1, rng: random.Random | None = None,  # noqa: ANN001
        greedy: bool = False) -> str:
    """Feed `windows` windows of steps to the gate, each step emitting `rate_of(arm)` tokens a second (times a
    random factor in [0.7, 1.3] with `rng`) until the gate ends its window (WINDOW steps, a probe fewer: the
    leader's window time); 'S' / 'P' / 'F' for each window's arm. `greedy`: the steps' rows all are."""
    if gate.window_log is None:
        gate.window_log = []
    arms = []
    for _ in range(windows):
        arm, ended = gate.arm, len(gate.window_log)
        arms.append(arm.name[0])
        while len(gate.window_log) == ended:
            noise = rng.uniform(0.7, 1.3) if rng else 1.0
            gate.observe(rows, num_tokens=rows, seconds=rows / (rate_of(arm) * noise), arm=gate.arm, greedy=greedy)
    return "".join(arms)


def test_batch_buckets_are_powers_of_two() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 256)] == [1, 2, 4, 4, 8, 8, 16, 16, 32, 256]


def runs_between(arms: str, probe: str) -> list[int]:
    """The lengths of the leader's runs between consecutive probes (`probe`: the probed arm's letter)."""
    return [len(run) for run in arms.split(probe)[1:-1]]


def test_where_speculation_loses_it_runs_only_as_probes_costing_the_budget() -> None:
    """Speculation 20 % slower (0.8 / 1.02 = 0.784 of plain's rate, the margin counted): the plain probe (window
    2) is judged against windows 1 and 3, plain leads, and speculation is probed after ceil(0.216 / EXPLORE_BUDGET)
    = 22 plain windows (a probe lasts a plain window's time and wastes 0.216 of it), then twice that, then MAX_GAP
    (each probe followed by the leader's window that judges it)."""
    gate = SpecGate()
    arms = run(gate, 160, lambda arm: 800.0 if arm is Arm.SPEC else 1000.0)
    assert arms.startswith("SPS") and runs_between(arms, "S") == [1, 22, 44, MAX_GAP]
    probes = [w for w in gate.window_log if w.arm is Arm.SPEC][2:]
    assert {w.steps for w in probes} == {13}  # 16 plain steps' time: 12.8 speculating ones, the 13th ends it
    state = gate.buckets[1, False]
    assert state.leader is Arm.PLAIN and state.gap == MAX_GAP
    assert (state.first_windows, state.second_windows) == (5, 155)
    assert abs(state.advantage - math.log(0.8)) < 1e-9
    assert abs(state.first_rate - 800) < 1e-6 and abs(state.second_rate - 1000) < 1e-6


def test_where_speculation_wins_plain_windows_are_rare_probes() -> None:
    """Speculation twice as fast: a plain probe lasts a speculating window's time (8 steps, not 16) and wastes
    half of it, so probes come ceil((1 - 1.02 / 2) / EXPLORE_BUDGET) = 49 windows apart."""
    gate = SpecGate()
    arms = run(gate, 140, lambda arm: 2000.0 if arm is Arm.SPEC else 1000.0)
    assert arms.startswith("SP" + "S" * 49 + "P") and arms.count("P") == 3
    assert [w.steps for w in gate.window_log if w.arm is Arm.PLAIN][1:] in ([8, 8], [9, 9])  # 8 steps' time, rounded
    assert gate.buckets[1, False].leader is Arm.SPEC


def test_narrow_losses_are_probed_often_then_less() -> None:
    """Speculation 1 % faster, under the margin: plain leads; a probe costs ~1 %, so the gap doubles from 1."""
    gate = SpecGate()
    arms = run(gate, 80, lambda arm: 1010.0 if arm is Arm.SPEC else 1000.0)
    assert arms.startswith("SPSPSPPS") and runs_between(arms, "S") == [1, 1, 2, 4, 8, 16, 32]
    assert gate.buckets[1, False].leader is Arm.PLAIN
    gate = SpecGate()
    run(gate, 40, lambda arm: 1000.0 * (1 + 2 * SPEC_MARGIN) if arm is Arm.SPEC else 1000.0)
    assert gate.buckets[1, False].leader is Arm.SPEC


def test_a_change_of_workload_moves_the_lead() -> None:
    """After speculation has lost for long (probes MAX_GAP apart), it takes the lead at its next probe once it
    wins (the advantage's EMA turns positive at once when it is 3x faster), and keeps it."""
    gate, speed = SpecGate(), {"spec": 800.0}
    run(gate, 100, lambda arm: speed["spec"] if arm is Arm.SPEC else 1000.0)
    speed["spec"] = 3000.0
    arms = run(gate, 2 * (MAX_GAP + 1) + 10, lambda arm: speed["spec"] if arm is Arm.SPEC else 1000.0)
    first = arms.index("S")
    assert first <= MAX_GAP and arms[first:first + 2] == "SP" and arms[first + 2:first + 12] == "S" * 10
    assert arms[-10:].count("S") >= 9


def test_a_probe_that_finds_the_other_arm_faster_is_followed_up_soon() -> None:
    """Speculation 10 % slower for long (probes MAX_GAP apart), then 12 % faster: its first probe's sample is not
    enough to move the EMA past the margin, but it contradicts the lead, so the next probe comes within the budget's
    gap instead of MAX_GAP later (doubling only while probes confirm the leader): speculation leads within about a
    gap and a half, where confirming at MAX_GAP would take three gaps."""
    gate, speed = SpecGate(), {"spec": 900.0}
    run(gate, 300, lambda arm: speed["spec"] if arm is Arm.SPEC else 1000.0)
    assert gate.buckets[1, False].leader is Arm.PLAIN and gate.buckets[1, False].gap == MAX_GAP
    speed["spec"] = 1120.0
    arms = run(gate, 3 * MAX_GAP, lambda arm: speed["spec"] if arm is Arm.SPEC else 1000.0)
    probes = [i for i, arm in enumerate(arms) if arm == "S"]
    assert probes[1] - probes[0] < MAX_GAP // 2  # the contradicting probe is followed up at once, not MAX_GAP on
    assert gate.buckets[1, False].leader is Arm.SPEC and arms.index("SS") < MAX_GAP + MAX_GAP // 2


def test_noisy_windows_still_leave_a_losing_arm_rarely_run() -> None:
    """Windows whose rate moves +-30 % at random: speculation at 0.8x of plain still runs in under a sixth of
    the windows (each probe that wins by noise is followed by a plain probe that takes the lead back)."""
    rng = random.Random(0)
    losing = run(SpecGate(), 2000, lambda arm: 800.0 if arm is Arm.SPEC else 1000.0, rng=rng)
    assert losing.count("S") < 2000 / 6
    winning = run(SpecGate(), 2000, lambda arm: 1600.0 if arm is Arm.SPEC else 1000.0, rng=rng)
    assert winning.count("P") < 2000 / 12


def test_a_drifting_host_does_not_fool_the_pairs() -> None:
    """The host's speed drifts by +-40 % over 40 windows, the same for both arms; speculation is 10 % slower.
    Judged against its neighbours, each probe sees the 10 %: speculation runs in few windows."""
    steps = iter(range(10**9))

    def rate_of(arm: Arm) -> float:
        host = 1 + 0.4 * math.sin(2 * math.pi * next(steps) / (40 * WINDOW))
        return host * (900.0 if arm is Arm.SPEC else 1000.0)

    arms = run(SpecGate(), 400, rate_of)
    assert arms.count("S") < 400 / 15


def test_buckets_learn_apart() -> None:
    """Batch 1 wins with drafts, batch 8 loses: each bucket keeps its own leader."""
    gate = SpecGate()
    for _ in range(10):
        run(gate, 10, lambda arm: 2000.0 if arm is Arm.SPEC else 1000.0, rows=1)
        run(gate, 10, lambda arm: 800.0 if arm is Arm.SPEC else 1000.0, rows=8)
    assert gate.buckets[1, False].leader is Arm.SPEC and gate.buckets[8, False].leader is Arm.PLAIN


def test_greedy_and_sampled_steps_learn_apart() -> None:
    """At one row drafting without the policy (FULL) is 1.5x the policy's rate on greedy steps and 0.7x on sampled
    ones, the workload changing every 30 windows: each kind keeps its own leaders, so once both are learnt a change
    runs the faster mode from its first window (the window the change cuts short was the other kind's). One bucket
    for both led each change with the mode of the kind before it until its probes turned the lead: 12-18 FULL
    windows of 30 greedy ones."""
    gate = SpecGate(full=True)
    greedy_rates = {Arm.FULL: 3000.0, Arm.SPEC: 2000.0, Arm.PLAIN: 1000.0}.get
    sampled_rates = {Arm.FULL: 1400.0, Arm.SPEC: 2000.0, Arm.PLAIN: 1000.0}.get
    for _ in range(3):
        run(gate, 30, greedy_rates, greedy=True)
        run(gate, 30, sampled_rates)
    assert gate.modes[1, True].leader is Arm.FULL and gate.modes[1, False].leader is Arm.SPEC
    greedy, sampled = run(gate, 30, greedy_rates, greedy=True), run(gate, 30, sampled_rates)
    assert greedy[1:5] == "FFFF" and greedy.count("F") >= 27, greedy
    assert sampled[1:5] == "SSSS" and sampled.count("S") >= 27, sampled


def test_steps_decided_in_the_other_arm_and_compiling_steps_are_not_counted() -> None:
    """A window's first step had its drafts decided in the window before; a step that compiled is no sample."""
    gate = SpecGate()
    gate.observe(1, 1, 100.0, arm=Arm.PLAIN)  # its drafts were decided in a plain window: not counted here
    gate.observe(1, 1, 100.0, arm=Arm.SPEC, countable=False)
    for _ in range(WINDOW - 2):
        gate.observe(1, 1, 0.001, arm=Arm.SPEC)
    assert abs(gate.buckets[1, False].first_rate - 1000) < 1e-6 and gate.plain


def test_a_stall_does_not_decide_the_lead() -> None:
    """One step of the first window takes ~900 steps' time (a first use after start-up): it is left out of the
    window's rate, so speculation, 30 % faster, leads from the first probe on. Counted, it made that window's rate
    ~40 times lower than plain's, and plain led until enough probes had outweighed it."""
    gate = SpecGate()
    gate.window_log = []
    for i in range(WINDOW):
        gate.observe(1, 1, 0.63 if i == 1 else 1 / 1300, arm=Arm.SPEC)
    assert gate.window_log[-1].counted == WINDOW - 1 and abs(gate.buckets[1, False].first_rate - 1300) < 1e-6
    arms = run(gate, 40, lambda arm: 1300.0 if arm is Arm.SPEC else 1000.0)
    assert arms.startswith("PS") and arms.count("P") <= 3 and gate.buckets[1, False].leader is Arm.SPEC, arms


def test_a_window_cut_short_by_the_batch_counts_only_if_half_ran() -> None:
    gate = SpecGate()
    for _ in range(WINDOW // 2 - 1):
        gate.observe(1, 1, 0.001, arm=Arm.SPEC)
    gate.observe(2, 2, 0.001, arm=Arm.SPEC)  # the batch grows: a window of 7 steps, not counted; bucket 2 starts
    assert gate.buckets[1, False].first_rate is None
    for _ in range(WINDOW // 2 - 1):
        gate.observe(2, 2, 0.001, arm=Arm.SPEC)
    gate.observe(1, 1, 0.001, arm=Arm.SPEC)  # back to bucket 1: bucket 2's window had half its steps and counts
    assert gate.buckets[2, False].first_rate is not None and not gate.plain  # bucket 1 still speculates first


def test_bucket_state_probe_schedule() -> None:
    state = BucketState()
    assert state.next_arm() is Arm.SPEC
    state.record(Arm.SPEC, 100.0, MAX_GAP)
    assert state.next_arm() is Arm.PLAIN
    state.record(Arm.PLAIN, 97.0, MAX_GAP)  # the probe waits for the leader's next window
    assert state.next_arm() is Arm.SPEC and state.advantage is None
    state.record(Arm.SPEC, 100.0, MAX_GAP)  # 97 against 100 and 100: spec 3 % ahead, 1 % past the margin
    assert abs(state.advantage - math.log(100 / 97)) < 1e-9 and (state.leader, state.gap) == (Arm.SPEC, 2)
    state.record(Arm.SPEC, 100.0, MAX_GAP)
    assert state.next_arm() is Arm.PLAIN
    state.record(Arm.PLAIN, 50.0, MAX_GAP)
    state.record(Arm.SPEC, 100.0, MAX_GAP)  # advantage 0.7 log(100 / 97) + 0.3 log 2: 23 % ahead less the margin
    # a probe of plain, at 1 / 1.23 of spec's rate, wastes 0.19 of its time: 19 windows (0.19 / EXPLORE_BUDGET)
    assert (state.leader, state.gap, state.first_windows, state.second_windows) == (Arm.SPEC, 19, 4, 2)


def test_the_engine_runs_plain_windows_without_drafts_and_feeds_the_gate(tmp_path) -> None:
    """An engine whose gate found plain faster at batch 1 (measured earlier: its state is preloaded) makes no
    decision and no draft there once its steps are seen: its steps are launched ahead as without speculation,
    greedy output unchanged. A fresh gate starts with speculation and measures both arms from the engine's own
    steps."""
    model, params, want = greedy_reference(tmp_path, max_tokens=100)
    llm = tiny_llm(model, speculative_config=NGRAM_K3)
    engine = llm.engine
    gate = engine.speculator.gate
    gate.buckets[1, True] = BucketState(first_rate=1.0, second_rate=2.0, leader=Arm.PLAIN, gap=MAX_GAP)  # greedy
    engine.step_log = []
    got = llm.generate(REPEATING, params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    stats, kinds = engine.get_stats().spec, [step.kind for step in engine.step_log]
    # one decision at most: after the prompt's step, before the gate has seen a step of batch 1
    assert stats.num_drafts <= 1 and stats.policy_steps <= 1 and kinds.count("verify") <= 1
    assert kinds.count("decode ahead") >= 0.9 * (len(kinds) - 2) and stats.plain_steps >= len(kinds) - 2
    engine.check_integrity()

    llm = tiny_llm(model, speculative_config=NGRAM_K3)
    got = llm.generate(REPEATING, params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    state, stats = llm.engine.speculator.gate.buckets[1, True], llm.engine.get_stats().spec
    # the plain probe: WINDOW steps, or fewer where they outlast a speculating window's time (MIN_PROBE_STEPS at least)
    assert state.first_rate > 0 and state.second_rate > 0 and stats.num_drafts > 0
    assert stats.plain_steps >= MIN_PROBE_STEPS
    llm.engine.check_integrity()


def test_the_engine_measures_greedy_and_sampled_steps_apart(tmp_path) -> None:
    """An n-gram engine's gate puts the windows of a greedy request and of a sampled one in their own buckets, and
    a step with a greedy and a sampled row in the sampled one."""
    model, params, want = greedy_reference(tmp_path, max_tokens=40)
    llm = tiny_llm(model, speculative_config=NGRAM_K3)
    gate = llm.engine.speculator.gate
    gate.window_log = []
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=40, ignore_eos=True)
    got = llm.generate(REPEATING, params, use_tqdm=False)
    greedy_windows = len(gate.window_log)
    llm.generate(REPEATING, sampled, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    assert {w.bucket for w in gate.window_log[:greedy_windows]} == {(1, True)}
    assert {w.bucket for w in gate.window_log[greedy_windows + 1:]} == {(1, False)} and set(gate.buckets) == {
        (1, True), (1, False)}
    llm.generate(REPEATING * 2, [params, sampled], use_tqdm=False)  # both rows in every step, to the end
    assert (2, False) in gate.buckets and (2, True) not in gate.buckets
    llm.engine.check_integrity()


def test_k_fixed_has_no_gate(tmp_path) -> None:
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64,
              speculative_config={"method": "ngram", "adaptive": False})
    assert llm.engine.speculator.gate is None and llm.engine.speculator.policy is None


def test_the_window_log_keeps_every_window_that_ended() -> None:
    gate = SpecGate()
    gate.window_log = []
    run(gate, 3, lambda arm: 800.0 if arm is Arm.SPEC else 1000.0)
    for _ in range(3):
        gate.observe(2, 2, 0.001, arm=gate.arm)  # bucket 2: cuts the fourth window after 0 steps
    log = gate.window_log
    assert [(w.bucket, w.arm, w.steps, w.recorded) for w in log] == [
        ((1, False), Arm.SPEC, WINDOW, True), ((1, False), Arm.PLAIN, WINDOW, True),
        ((1, False), Arm.SPEC, WINDOW, True), ((1, False), Arm.PLAIN, 0, False)]
    assert abs(log[0].tokens / log[0].seconds - 800) < 1e-6 and log[1].counted == WINDOW


def test_without_drafts_the_engine_steps_as_without_speculation(tmp_path) -> None:
    """A closed loop (a request added as each one ends) over an engine whose gate runs plain everywhere makes the
    very steps of the engine without speculation. Regression: steps without drafts were launched early, before
    the caller saw the outputs that ended requests, so the requests it added then missed the step (H200, closed
    loop at 128 in flight: 0.91x of off with no draft made)."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    requests = [({"prompt_token_ids": list(range(10 + i, 18 + i))},
                 SamplingParams(temperature=0, max_tokens=4 + 3 * (i % 4), ignore_eos=True)) for i in range(12)]
    plain = {(b, True): BucketState(leader=Arm.PLAIN, gap=MAX_GAP) for b in (1, 2, 4)}  # greedy
    steps = []
    for spec in (None, {"method": "ngram"}):
        llm = LLM(model=str(model), skip_tokenizer_init=True, num_kv_blocks=64, speculative_config=spec)
        if spec is not None:
            llm.engine.speculator.gate.buckets.update(plain)
        llm.engine.step_log = []
        steady_throughput(llm.engine, requests, concurrency=4)
        steps.append([(s.kind, s.num_rows, s.num_tokens) for s in llm.engine.step_log])
        llm.engine.check_integrity()
    off, spec = steps
    # the same steps; the second was decided at the first (the gate had seen no step yet), not launched ahead
    assert spec[2:] == off[2:] and spec[1][1:] == off[1][1:] and len(off) > 10


def test_probes_of_dear_speculating_steps_cost_a_leader_windows_time() -> None:
    """A draft model's verify at 128 rows (H200, 2026-12-07): 15 ms for 2.37 tokens a row, where a plain step takes
    2.7 ms for one. A probe of WINDOW such steps would take 5.5 plain windows' time; cut at one plain window's, the
    probes cost under 2 % of the throughput (1 - 0.43 of a window every MAX_GAP windows at most)."""
    gate = SpecGate()
    gate.window_log = []
    seconds = plain_seconds = 0.0
    while len(gate.window_log) < 1000:
        tokens, step = (128, 2.7e-3) if gate.plain else (round(2.37 * 128), 15e-3)
        gate.observe(128, tokens, step, arm=gate.arm)
        seconds, plain_seconds = seconds + step, plain_seconds + tokens / 128 * 2.7e-3
    assert gate.buckets[128, False].leader is Arm.PLAIN and plain_seconds / seconds > 0.98
    assert {w.steps for w in gate.window_log[3:] if w.arm is Arm.SPEC} == {MIN_PROBE_STEPS}


def test_a_held_arm_runs_every_window_and_records_none() -> None:
    """hold(PLAIN) where speculation is twice as fast: every window plain, none recorded in the buckets' states
    (logged, not recorded); after hold(None) the gate chooses as if it had never been held."""
    gate = SpecGate(full=True)
    gate.window_log = []
    gate.hold(Arm.PLAIN)
    assert gate.plain
    assert run(gate, 40, {Arm.FULL: 2000.0, Arm.SPEC: 2000.0, Arm.PLAIN: 1000.0}.get) == "P" * 40
    state = gate.buckets[1, False]
    assert state.advantage is None and state.first_windows == state.second_windows == 0
    assert len(gate.window_log) == 40 and not any(w.recorded for w in gate.window_log)
    gate.hold(None)
    rates = {Arm.FULL: 2000.0, Arm.SPEC: 2000.0, Arm.PLAIN: 1000.0}.get
    assert run(gate, 8, rates) == run(SpecGate(full=True), 8, rates) != "P" * 8


def test_an_engine_held_plain_drafts_nothing_and_matches_off(tmp_path) -> None:
    """The gate held in PLAIN (the bench's METHOD-plain rows): n-gram on a repeating prompt drafts nothing, every
    step is a plain window's, and the greedy tokens are off's."""
    model, params, reference = greedy_reference(tmp_path, max_tokens=24)
    llm = tiny_llm(model, speculative_config=NGRAM_K3)
    llm.engine.speculator.gate.hold(Arm.PLAIN)
    llm.engine.step_log = []
    outputs = llm.generate(REPEATING, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in reference]
    spec = llm.engine.get_stats().spec
    assert spec.num_draft_tokens == 0 and spec.plain_steps == len(llm.engine.step_log) == 24
    llm.engine.check_integrity()


def test_a_probe_is_judged_against_the_geometric_mean_of_its_neighbours() -> None:
    """Neighbours at 1000 and 1500 and a probe at their geometric mean: no advantage either way (the arithmetic
    mean, 1250, would have counted the probe 2 % slower: a bias against the probed arm wherever windows vary)."""
    state = BucketState(leader=Arm.PLAIN, gap=1)
    state.record(Arm.PLAIN, 1000.0, MAX_GAP)
    state.record(Arm.SPEC, math.sqrt(1000.0 * 1500.0), MAX_GAP)
    state.record(Arm.PLAIN, 1500.0, MAX_GAP)
    assert abs(state.advantage) < 1e-12


def test_a_probe_across_a_change_of_workload_judges_nothing() -> None:
    """The leader's windows around a probe at 8,000 and 2,000 tok/s (a new prompt in between): the probe's 2,500
    is no sample of speculation's advantage; the next probe comes after the gap (here 1 window), as after any."""
    state = BucketState(leader=Arm.PLAIN, gap=1)
    state.record(Arm.PLAIN, 8000.0, MAX_GAP)
    assert state.next_arm() is Arm.SPEC
    state.record(Arm.SPEC, 2500.0, MAX_GAP)
    state.record(Arm.PLAIN, 2000.0, MAX_GAP)
    assert state.advantage is None and state.leader is Arm.PLAIN and state.next_arm() is Arm.PLAIN
    state.record(Arm.PLAIN, 2000.0, MAX_GAP)
    assert state.next_arm() is Arm.SPEC
    state.record(Arm.SPEC, 2500.0, MAX_GAP)
    state.record(Arm.PLAIN, 2000.0, MAX_GAP)
    assert abs(state.advantage - math.log(2500.0 / 2000.0)) < 1e-12

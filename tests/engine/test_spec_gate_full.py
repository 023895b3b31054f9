"""SpecGate's FULL mode: speculating windows choose between the policy (S) and drafts without it (F) as speculation
and plain are chosen, and the engine drafts without its policy in FULL windows (looking a step ahead while no match
is in sight, not while a request samples)."""
from __future__ import annotations

import math

from lamina import LLM, SamplingParams
from lamina.engine.spec_gate import FULL_MARGIN, MAX_GAP, SPEC_MARGIN, Arm, BucketState, SpecGate, full_margin
from lamina.spec.ngram import NgramProposer
from tests.engine.test_spec_gate import run
from tests.helpers.spec_cases import NGRAM_K3, REPEATING, greedy_reference, tiny_llm


def test_speculating_windows_draft_without_the_policy_where_that_is_faster() -> None:
    """full=True: the speculating windows choose between the policy (S) and drafts without it (F) as speculation
    and plain are chosen. Drafting without the policy 20 % faster: plain is probed first (window 2), and once the
    policy has been found faster than plain (window 3), drafts without the policy (window 4), which lead from the
    policy's next window on; the policy is probed rarely, plain more rarely still (both as the budget allows)."""
    gate = SpecGate(full=True)
    arms = run(gate, 120, {Arm.FULL: 1200.0, Arm.SPEC: 1000.0, Arm.PLAIN: 600.0}.get)
    assert arms.startswith("SPSFSFFF") and arms[4:].count("F") >= 100 and "S" in arms[40:] and arms.count("P") <= 4
    assert gate.buckets[1, False].leader is Arm.SPEC and gate.modes[1, False].leader is Arm.FULL
    assert abs(gate.modes[1, False].advantage - math.log(1.2)) < 0.05


def test_drafts_without_the_policy_that_lose_are_only_probed() -> None:
    """... and where they lose, they are probed as rarely as the budget allows; a probe of theirs is not taken for
    speculation's rate, so the policy, faster than plain, keeps the lead."""
    gate = SpecGate(full=True)
    arms = run(gate, 120, {Arm.FULL: 700.0, Arm.SPEC: 1000.0, Arm.PLAIN: 900.0}.get)
    assert arms.startswith("SPSFSSSS") and arms.count("F") <= 4 and arms.count("P") <= 6, arms
    assert gate.buckets[1, False].leader is Arm.SPEC and gate.modes[1, False].leader is Arm.SPEC


def test_drafts_without_the_policy_need_a_wider_edge_where_a_bucket_holds_several_rows() -> None:
    """FULL 4 % faster than the policy: at 8 rows, under FULL_MARGIN, the policy keeps the lead (FULL's windows run
    ahead of a fixed batch's tail, which their rate does not charge); at one row, where there is no tail, FULL leads
    past SPEC_MARGIN. Speculation against plain needs SPEC_MARGIN only."""
    rates = {Arm.FULL: 1040.0, Arm.SPEC: 1000.0, Arm.PLAIN: 900.0}.get
    several, one = SpecGate(full=True), SpecGate(full=True)
    run(several, 120, rates, rows=8)
    run(one, 120, rates, rows=1)
    assert several.modes[8, False].leader is Arm.SPEC and several.buckets[8, False].leader is Arm.SPEC
    assert one.modes[1, False].leader is Arm.FULL and one.buckets[1, False].leader is Arm.SPEC
    assert abs(several.modes[8, False].advantage - math.log(1.04)) < 1e-6 and FULL_MARGIN > 0.04 > SPEC_MARGIN
    assert full_margin(1) == SPEC_MARGIN and full_margin(2) == full_margin(256) == FULL_MARGIN


def test_where_plain_leads_drafts_without_the_policy_are_not_probed() -> None:
    """128 rows where FULL runs at 0.45 of plain's rate and the policy, drafting little, at 0.98: plain leads after
    its first probe, and speculation's probes run in the policy's mode; FULL is never tried (it would be probed
    inside speculation's probes, both arms' losses at once)."""
    gate = SpecGate(full=True)
    arms = run(gate, 300, {Arm.FULL: 450.0, Arm.SPEC: 980.0, Arm.PLAIN: 1000.0}.get, rows=128)
    assert arms.startswith("SPS") and "F" not in arms and gate.buckets[128, False].leader is Arm.PLAIN
    assert gate.modes[128, False].leader is Arm.SPEC and gate.modes[128, False].first_windows == 0


def test_when_plain_takes_the_lead_speculation_is_probed_with_the_policy_again() -> None:
    """Drafts without the policy lead on one workload (FULL 1.3x plain, the policy 1.05x); on the next FULL runs at
    0.9x plain and the policy would run 1.2x. Plain takes the lead from FULL before the modes are compared again,
    and the modes then start over with the policy leading: speculation leads again, in the policy's mode. (Were
    FULL to keep the modes' lead, which is not compared while plain leads, its probes alone would keep plain
    leading.)"""
    gate = SpecGate(full=True)
    run(gate, 200, {Arm.FULL: 1300.0, Arm.SPEC: 1050.0, Arm.PLAIN: 1000.0}.get)
    assert gate.modes[1, False].leader is Arm.FULL and gate.buckets[1, False].leader is Arm.SPEC
    arms = run(gate, 300, {Arm.FULL: 900.0, Arm.SPEC: 1200.0, Arm.PLAIN: 1000.0}.get)
    assert gate.buckets[1, False].leader is Arm.SPEC and gate.modes[1, False].leader is Arm.SPEC
    assert arms[100:].count("S") >= 190 and arms[100:].count("F") <= 5, arms


def full_window_engine(tmp_path, greedy: bool = True) -> tuple[LLM, SamplingParams, list]:  # noqa: ANN001
    """An n-gram engine (k = 3) whose gate found drafting without the policy faster at batch 1 (its state
    preloaded for `greedy` steps or sampled ones), the greedy parameters, and the output without speculation."""
    model, params, want = greedy_reference(tmp_path, max_tokens=100)
    llm = tiny_llm(model, speculative_config=NGRAM_K3)
    gate = llm.engine.speculator.gate
    gate.buckets[1, greedy] = BucketState(leader=Arm.SPEC, gap=MAX_GAP)
    gate.modes[1, greedy] = BucketState(Arm.FULL, Arm.SPEC, FULL_MARGIN, leader=Arm.FULL, gap=MAX_GAP)
    llm.engine.step_log = []
    return llm, params, want


def test_the_engine_drafts_without_its_policy_in_full_windows(tmp_path) -> None:
    """In FULL windows the engine drafts at every match it sees, k fixed's way: greedy output unchanged, full
    steps counted, and the policy neither decides there nor learns from their verifies (its match table is
    unchanged)."""
    llm, params, want = full_window_engine(tmp_path)
    engine, policy = llm.engine, llm.engine.speculator.policy
    table = [list(row) for row in policy.matches._counts]
    got = llm.generate(REPEATING, params, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    stats, kinds = engine.get_stats().spec, [step.kind for step in engine.step_log]
    # before the gate has seen a step of batch 1, at most the prompt's step is decided by the policy
    assert stats.full_steps >= len(kinds) - 2 and stats.policy_steps <= 1 and stats.num_drafts >= 5
    assert [list(row) for row in policy.matches._counts] == table
    engine.check_integrity()


def test_full_windows_launch_a_step_ahead_while_no_match_is_in_sight(tmp_path) -> None:
    """n-gram's FULL windows (speculator.py's docstring): step i is launched ahead of step i - 1's tokens exactly
    when the tokens read before it (those of steps 0 .. i - 2) hold no match and step i - 1 verified nothing; a
    verify step's drafts are the proposal from every token before it. Replayed on the greedy output: each step's
    tokens known, its drafts proposed and accepted as the engine must have."""
    llm, params, want = full_window_engine(tmp_path)
    got = llm.generate(REPEATING, params, use_tqdm=False)
    seq = REPEATING[0]["prompt_token_ids"] + list(want[0].outputs[0].token_ids)
    assert list(got[0].outputs[0].token_ids) == seq[len(REPEATING[0]["prompt_token_ids"]):]
    proposer = NgramProposer(3, 1, 4)
    steps = llm.engine.step_log
    known = [len(REPEATING[0]["prompt_token_ids"])]  # known[i]: the tokens read before step i ran
    for step in steps:
        drafts = proposer.propose([seq[:known[-1]]], [3])[0] if step.kind.startswith("verify") else []
        assert step.num_tokens == (len(drafts) + 1 if drafts else known[0] if step.kind == "prefill" else 1)
        accepted = next((j for j, d in enumerate(drafts) if seq[known[-1] + j] != d), len(drafts))
        known.append(known[-1] + accepted + 1)
    aheads = 0
    for i in range(2, len(steps)):
        if known[i] > len(seq) - 4:  # the last tokens: no drafts past max_tokens, nothing launched past it
            break
        in_sight = bool(proposer.propose([seq[:known[i - 1]]], [1])[0])
        ahead = steps[i].kind == "decode ahead"
        assert ahead == (not in_sight and steps[i - 1].kind not in ("verify", "prefill")), (i, steps[i].kind)
        aheads += ahead
    assert aheads >= 20 and sum(step.kind == "verify" for step in steps) >= 3
    llm.engine.check_integrity()


def test_full_windows_do_not_look_ahead_while_a_request_samples(tmp_path) -> None:
    """A sampled step launched ahead saves little (its host work hides the device's): with a request that samples,
    FULL windows decide every step after the tokens before it, as k fixed does."""
    llm, _, _ = full_window_engine(tmp_path, greedy=False)
    sampled = SamplingParams(temperature=0.8, seed=3, max_tokens=60, ignore_eos=True)
    got = llm.generate(REPEATING, sampled, use_tqdm=False)
    kinds = [step.kind for step in llm.engine.step_log]
    assert len(got[0].outputs[0].token_ids) == 60 and len(kinds) > 10
    assert "decode ahead" not in kinds and llm.engine.get_stats().spec.full_steps >= len(kinds) - 2
    llm.engine.check_integrity()

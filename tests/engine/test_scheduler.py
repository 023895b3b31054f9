"""Scheduler unit tests: pure Python, the real KV cache manager, a fake model runner."""
from __future__ import annotations

import pickle

from lamina.config import SchedulerConfig
from lamina.engine.request import Request, RequestStatus
from lamina.engine.scheduler import Scheduler
from lamina.kv.kv_manager import KVCacheManager
from lamina.sampling_params import SamplingParams
from lamina.step import ModelRunnerOutput, SchedulerOutput

BS = 4


def make_scheduler(num_blocks: int = 64, budget: int = 64, max_seqs: int = 16, caching: bool = True,
                   max_model_len: int = 1000) -> Scheduler:
    kv = KVCacheManager(num_blocks, BS, caching)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs), kv, max_model_len)


def make_request(rid: str, n_prompt: int, max_tokens: int = 8, base: int = 0, **params) -> Request:
    prompt = [(base + i) % 50 + 1 for i in range(n_prompt)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, **params), eos_token_ids=frozenset({0}))


def fake_output(s: Scheduler, out: SchedulerOutput, token: int | None = None) -> ModelRunnerOutput:
    """A request samples when its chunk reaches the end of its tokens, like the real runner (call it before
    update_from_output)."""
    sampled = {}
    for r in (s.requests[req_id] for req_id in out.req_ids):
        if r.num_computed_tokens + out.num_scheduled_tokens[r.request_id] >= r.num_tokens:
            sampled[r.request_id] = [token if token is not None else 7 + r.num_tokens % 5]
    return ModelRunnerOutput(sampled_token_ids=sampled)


def step(s: Scheduler, token: int | None = None) -> SchedulerOutput:
    out = s.schedule()
    for req_id, num in out.num_scheduled_tokens.items():  # every scheduled token has a KV slot
        request = s.requests[req_id]
        assert len(s.kv.block_ids(req_id)) * BS >= request.num_computed_tokens + num, req_id
    s.update_from_output(out, fake_output(s, out, token))
    s.kv.check_integrity()
    return out


def run_all(s: Scheduler, max_steps: int = 500) -> int:
    steps = 0
    while s.has_unfinished_requests():
        step(s)
        steps += 1
        assert steps < max_steps, "scheduler did not finish"
    return steps


def test_chunked_prefill_splits_prompt_over_budget_and_mixes_decodes():
    s = make_scheduler(budget=16)
    s.add_request(make_request("a", 10))
    s.add_request(make_request("b", 20))
    out = step(s)
    assert out.num_scheduled_tokens == {"a": 10, "b": 6}
    out = step(s)
    # a decodes one token, b gets the next chunk of its prompt in the same step
    assert out.num_scheduled_tokens == {"a": 1, "b": 14}
    out = step(s)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    run_all(s)


def test_token_budget_and_max_num_seqs_are_respected():
    s = make_scheduler(budget=32, max_seqs=3)
    for i in range(6):
        s.add_request(make_request(f"r{i}", 5, base=10 * i))
    while s.has_unfinished_requests():
        out = step(s)
        assert out.total_num_scheduled_tokens <= 32
        assert len(s.running) <= 3


def test_preemption_newest_first_no_admission_and_recompute_resume():
    # 9 usable blocks of 4 tokens; three requests of 8 prompt tokens that want 24 tokens each.
    s = make_scheduler(num_blocks=10, budget=64)
    for i in range(3):
        s.add_request(make_request(f"r{i}", 8, max_tokens=16, base=10 * i))
    step(s)
    assert [r.request_id for r in s.running] == ["r0", "r1", "r2"]
    saw_preemption = False
    while s.has_unfinished_requests():
        waiting_before = [r.request_id for r in s.waiting]
        running_before = [r.request_id for r in s.running]
        out = s.schedule()
        if out.preempted_req_ids:
            # newest first (r2 before r1), and nothing new is admitted in that step
            assert out.preempted_req_ids[0] == running_before[-1]
            assert out.preempted_req_ids[0] == "r2" or saw_preemption
            saw_preemption = True
            assert all(req_id not in waiting_before for req_id in out.req_ids)
            for rid in out.preempted_req_ids:
                victim = next(r for r in s.waiting if r.request_id == rid)
                assert victim.num_computed_tokens == 0 and s.kv.block_ids(victim.request_id) == []
                assert victim.status == RequestStatus.PREEMPTED
        s.update_from_output(out, fake_output(s, out))
        s.kv.check_integrity()
    assert saw_preemption
    assert s.stats.num_preemptions >= 1
    assert s.kv.num_free_blocks + s.kv.num_cached_blocks == 9


def test_preempted_request_keeps_its_output_and_gets_prefix_hit():
    s = make_scheduler(num_blocks=10, budget=64)
    a = make_request("a", 8, max_tokens=20)
    b = make_request("b", 8, max_tokens=20, base=20)
    s.add_request(a)
    s.add_request(b)
    while b.status != RequestStatus.PREEMPTED:
        step(s)
        assert s.has_unfinished_requests()
    produced = list(b.output_token_ids)
    assert produced, "b should have produced tokens before it was preempted"
    # b resumes later with its committed full blocks found in the prefix cache
    while b.status != RequestStatus.RUNNING:
        out = step(s)
    assert b.output_token_ids[:len(produced)] == produced
    assert out.num_scheduled_tokens["b"] < b.num_tokens  # not everything recomputed
    run_all(s)


def test_stop_conditions():
    s = make_scheduler()
    s.add_request(make_request("eos", 4, max_tokens=10))
    s.add_request(make_request("ignore", 4, max_tokens=3, base=5, ignore_eos=True))
    s.add_request(make_request("minimum", 4, max_tokens=10, base=9, min_tokens=2))
    s.add_request(make_request("stop_id", 4, max_tokens=10, base=13, stop_token_ids=[0]))
    finished = {}
    while s.has_unfinished_requests():
        out = s.schedule()
        changed = s.update_from_output(out, fake_output(s, out, token=0))
        finished.update({r.request_id: r for r in changed if r.is_finished})
    assert finished["eos"].output_token_ids == [0] and finished["eos"].finish_reason == "stop"
    assert finished["eos"].stop_reason is None
    assert finished["ignore"].output_token_ids == [0, 0, 0] and finished["ignore"].finish_reason == "length"
    assert finished["minimum"].output_token_ids == [0, 0] and finished["minimum"].finish_reason == "stop"
    # with ignore_eos off, EOS (0) wins first; a stop token that is not EOS sets stop_reason
    s2 = make_scheduler()
    s2.add_request(make_request("stop_id", 4, max_tokens=10, stop_token_ids=[3]))
    while s2.has_unfinished_requests():
        out = s2.schedule()
        changed = s2.update_from_output(out, fake_output(s2, out, token=3))
    assert changed[0].stop_reason == 3 and changed[0].finish_reason == "stop"
    s.kv.check_integrity()


def test_max_model_len_caps_output():
    s = make_scheduler(max_model_len=12)
    r = make_request("a", 10, max_tokens=None)
    s.add_request(r)
    run_all(s)
    assert r.num_output_tokens == 2 and r.finish_reason == "length"


def test_prefix_cache_hit_is_block_aligned_and_capped():
    s = make_scheduler()
    first = make_request("first", 12, max_tokens=1)
    s.add_request(first)
    run_all(s)
    again = make_request("again", 12, max_tokens=1)  # same 12 tokens = 3 full blocks
    s.add_request(again)
    out = step(s)
    # the last token is always computed, so only 2 of the 3 blocks are hits
    assert again.metrics.num_cached_tokens == 8
    assert out.num_scheduled_tokens["again"] == 4
    run_all(s)
    assert s.make_stats().prefix_cache_hits == 8


def test_parallel_samples_wait_for_the_parent_prompt():
    for caching in (True, False):
        s = make_scheduler(budget=8, caching=caching)
        parent = make_request("0_x", 14, max_tokens=3)
        child = Request("1_x", list(parent.prompt_token_ids), SamplingParams(max_tokens=3), parent=parent,
                        sample_index=1)
        s.add_request(parent)
        s.add_request(child)
        out = step(s)
        assert list(out.num_scheduled_tokens) == ["0_x"]  # the child waits while the prompt is chunked
        step(s)
        out = step(s)
        assert out.num_scheduled_tokens["1_x"] == 14 - 12  # 3 shared full blocks, last 2 tokens computed
        run_all(s)


def test_finish_request_aborts_and_frees():
    s = make_scheduler()
    r = make_request("a", 6, max_tokens=50)
    s.add_request(r)
    step(s)
    s.finish_request("a", RequestStatus.FINISHED_ABORTED)
    assert r.finish_reason == "abort" and not s.has_unfinished_requests()
    s.kv.check_integrity()
    assert s.schedule().finished_req_ids == ["a"]


# ---- scheduling ahead of a step in flight -----------------------------------------------------------


def ahead_output(ahead: SchedulerOutput, token: int) -> ModelRunnerOutput:
    return ModelRunnerOutput(sampled_token_ids={req_id: [token] for req_id in ahead.req_ids})


def test_schedule_ahead_decodes_the_next_position_and_skips_length_finishers():
    s = make_scheduler()
    a, b = make_request("a", 6, max_tokens=8), make_request("b", 3, max_tokens=2)
    s.add_request(a)
    s.add_request(b)
    step(s)  # both prompts: first tokens sampled
    inflight = s.schedule()  # a decodes its 2nd token, b its 2nd and last
    ahead = s.schedule_ahead(inflight)
    assert ahead is not None and ahead.decode_ahead and ahead.req_ids == ["a"]  # b ends by length in `inflight`
    assert ahead.num_scheduled_tokens == {"a": 1}
    assert len(s.kv.block_ids("a")) * BS >= a.num_tokens + 1  # room for position num_tokens (the in-flight token)
    s.update_from_output(inflight, fake_output(s, inflight, token=9))
    assert b.is_finished and a.num_computed_tokens == a.num_tokens - 1 == 7
    s.update_from_output(ahead, ahead_output(ahead, token=11))
    assert a.num_computed_tokens == 8 and a.output_token_ids[-2:] == [9, 11]
    s.kv.check_integrity()


def test_schedule_ahead_chains_and_drops_results_of_requests_that_stopped():
    s = make_scheduler()
    a, b = make_request("a", 5, max_tokens=50), make_request("b", 5, max_tokens=50, base=9)
    s.add_request(a)
    s.add_request(b)
    step(s)
    first = s.schedule()
    second = s.schedule_ahead(first)
    s.update_from_output(first, ModelRunnerOutput(sampled_token_ids={"a": [0], "b": [3]}))  # a: EOS
    assert a.is_finished and a.status == RequestStatus.FINISHED_STOPPED
    third = s.schedule_ahead(second)  # a is gone: b alone
    assert third is not None and third.req_ids == ["b"]
    changed = s.update_from_output(second, ahead_output(second, token=4))
    assert changed == [b] and a.output_token_ids == [7 + 5 % 5, 0]  # a's ahead token is dropped
    s.update_from_output(third, ahead_output(third, token=5))
    assert b.output_token_ids[-3:] == [3, 4, 5] and b.num_computed_tokens == b.num_tokens - 1
    s.kv.check_integrity()


def test_schedule_ahead_waits_for_the_tokens_when_it_must():
    s = make_scheduler()
    a = make_request("a", 5, max_tokens=50)
    s.add_request(a)
    step(s)
    inflight = s.schedule()
    s.add_request(make_request("w", 3))
    assert s.schedule_ahead(inflight) is None  # a waiting request is admitted by schedule()
    s = make_scheduler(budget=4)
    long = make_request("long", 10)
    s.add_request(long)
    assert s.schedule_ahead(s.schedule()) is None  # mid-prompt: nothing sampled in flight
    for params in (dict(frequency_penalty=0.5), dict(repetition_penalty=1.2), dict(min_tokens=3)):
        s = make_scheduler()
        s.add_request(make_request("p", 5, max_tokens=50, **params))
        step(s)
        assert s.schedule_ahead(s.schedule()) is None, params  # sampling reads the output so far
    s = make_scheduler(num_blocks=3)  # 2 usable blocks of 4 tokens: a's next position needs a third
    s.add_request(make_request("full", 7, max_tokens=50))
    step(s)
    assert s.schedule_ahead(s.schedule()) is None


# ---- the step message ------------------------------------------------------------------------------


def test_the_message_sends_a_request_whole_once_then_only_its_changes():
    s = make_scheduler(budget=6)
    a = make_request("a", 9, max_tokens=20)
    s.add_request(a)
    first = s.schedule()  # a's first chunk: 6 of 9 prompt tokens, 2 blocks
    assert [n.req_id for n in first.new_reqs] == ["a"] and not first.cached_reqs.req_ids
    new = first.new_reqs[0]
    assert (new.prompt_token_ids, new.output_token_ids, new.num_computed_tokens) == (a.prompt_token_ids, [], 0)
    assert new.block_ids == s.kv.block_ids("a") and len(new.block_ids) == 2
    s.update_from_output(first, fake_output(s, first))
    second = s.schedule()  # the rest of the prompt: a third block is appended
    assert not second.new_reqs and second.cached_reqs.req_ids == ["a"]
    assert second.cached_reqs.num_computed_tokens == [6]
    assert second.cached_reqs.block_ids_start == [2] and second.cached_reqs.new_block_ids == [s.kv.block_ids("a")[2:]]
    s.update_from_output(second, fake_output(s, second))
    third = s.schedule()  # a decode inside its third block: no block change
    assert third.cached_reqs.block_ids_start == [3] and third.cached_reqs.new_block_ids == [[]]
    pickle.loads(pickle.dumps(third))  # plain data


def test_a_preempted_request_is_dropped_by_the_worker_and_sent_whole_again():
    s = make_scheduler(num_blocks=10, budget=64, caching=False)
    a = make_request("a", 8, max_tokens=20)
    b = make_request("b", 8, max_tokens=20, base=20)
    s.add_request(a)
    s.add_request(b)
    preempting = None
    while preempting is None:
        out = step(s)
        if out.preempted_req_ids:
            preempting = out
    assert preempting.preempted_req_ids == ["b"] and "b" not in preempting.req_ids
    produced = list(b.output_token_ids)
    while True:
        out = step(s)
        if "b" in out.req_ids:
            break
    resent = next(n for n in out.new_reqs if n.req_id == "b")
    assert resent.output_token_ids == produced and resent.num_computed_tokens == 0
    run_all(s)


def test_finished_ids_reach_the_worker_in_the_next_message():
    s = make_scheduler()
    s.add_request(make_request("short", 3, max_tokens=1))
    s.add_request(make_request("long", 3, max_tokens=5, base=7))
    step(s)  # short samples its one token and ends
    assert s.schedule().finished_req_ids == ["short"]


def add_two_samples(s: Scheduler, n_prompt: int, max_tokens: int) -> tuple[Request, Request]:
    """Samples 0 and 1 of one n = 2 request ("p", "p_1"), as the input processor makes them."""
    parent = make_request("p", n_prompt, max_tokens=max_tokens)
    child = Request("p_1", list(parent.prompt_token_ids), parent.sampling_params, parent=parent, sample_index=1,
                    eos_token_ids=frozenset({0}))
    s.add_request(parent)
    s.add_request(child)
    return parent, child


def test_a_forked_sample_gets_blocks_for_the_rest_of_its_prompt():
    """n > 1 with the prefix cache off: sample 1 shares sample 0's full prompt blocks and needs its own for
    the rest (a regression: it was scheduled past the end of its block table)."""
    s = make_scheduler(caching=False)
    _, child = add_two_samples(s, n_prompt=15, max_tokens=4)
    step(s)  # the parent's prompt; the child waits for it
    out = step(s)  # the child: 12 tokens shared (3 blocks), 3 to compute in a 4th block
    assert out.num_scheduled_tokens["p_1"] == 3 and child.metrics.num_cached_tokens == 12
    run_all(s)
    s.kv.check_integrity()


def test_a_sample_resumed_after_preemption_shares_only_the_prompt():
    """Its outputs differ from sample 0's: forking past the prompt raised (a regression)."""
    s = make_scheduler(caching=False)
    _, child = add_two_samples(s, n_prompt=6, max_tokens=30)
    for _ in range(4):
        step(s)
    s.running.remove(child)
    s._preempt(child)  # as when blocks run out
    num_tokens = child.num_tokens
    out = step(s)
    assert num_tokens > child.num_prompt_tokens and "p_1" in out.req_ids
    assert out.num_scheduled_tokens["p_1"] == num_tokens - 4  # one shared block of the prompt
    run_all(s)
    s.kv.check_integrity()

"""Drafts on the engine side: who may get them and how many, cutting them to the budget, dropping them before
preempting anyone, and the counters of verified drafts."""
from __future__ import annotations

from lamina.config import SchedulerConfig
from lamina.engine import drafts
from lamina.engine.request import Request
from lamina.engine.scheduler import Scheduler
from lamina.kv.kv_manager import KVCacheManager
from lamina.sampling_params import SamplingParams


def decoding(n_prompt: int = 6, n_out: int = 2, **params) -> Request:
    """A request that has produced n_out tokens and waits to compute its last one (num_tokens - 1 computed)."""
    request = Request("r", list(range(1, n_prompt + 1)), SamplingParams(**params))
    request.append_output_token_ids([7] * n_out)
    request.num_computed_tokens = request.num_tokens - 1
    return request


def test_max_drafts_never_passes_max_tokens_or_max_model_len() -> None:
    assert drafts.max_drafts(decoding(max_tokens=100), k=3, max_model_len=100) == 3
    assert drafts.max_drafts(decoding(max_tokens=5), k=3, max_model_len=100) == 2  # 2 out + 2 drafts + 1 = 5
    assert drafts.max_drafts(decoding(max_tokens=3), k=3, max_model_len=100) == 0
    assert drafts.max_drafts(decoding(max_tokens=None), k=3, max_model_len=11) == 2  # 8 tokens + 2 + 1 = 11


def test_no_drafts_mid_prompt_or_where_sampling_reads_its_output() -> None:
    mid_prompt = decoding()
    mid_prompt.num_computed_tokens = 3
    assert drafts.max_drafts(mid_prompt, k=3, max_model_len=100) == 0
    for params in ({"presence_penalty": 0.5}, {"repetition_penalty": 1.2}, {"min_tokens": 5}):
        assert drafts.max_drafts(decoding(**params), k=3, max_model_len=100) == 0, params
    assert drafts.max_drafts(decoding(min_tokens=2), k=3, max_model_len=100) == 3  # min_tokens reached
    assert drafts.max_drafts(decoding(logprobs=2), k=3, max_model_len=100) == 3  # verified rows give logprobs


def test_fit_to_budget_keeps_the_drafts_the_step_reaches() -> None:
    request = decoding()
    request.spec_token_ids = [4, 5, 6]
    drafts.fit_to_budget(request, num_new=3)  # the last token and 2 drafts
    assert request.spec_token_ids == [4, 5]
    drafts.fit_to_budget(request, num_new=1)
    assert request.spec_token_ids == []


def test_drafts_are_dropped_before_anyone_is_preempted() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=False)  # 3 usable blocks
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4), kv, max_model_len=64)
    request = Request("r", list(range(1, 12)), SamplingParams(max_tokens=20))  # 11 tokens: 3 blocks
    scheduler.add_request(request)
    out = scheduler.schedule()
    request.append_output_token_ids([5])  # as update_from_output would; 12 tokens fill the 3 blocks
    request.num_computed_tokens = 11
    request.spec_token_ids = [1, 2, 3]  # would need a 4th block
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"r": 1} and not out.preempted_req_ids and request.spec_token_ids == []
    kv.check_integrity()


def test_spec_decode_stats_count_positions() -> None:
    stats = drafts.SpecDecodeStats()
    stats.record(num_drafts=3, num_accepted=2)
    stats.record(num_drafts=2, num_accepted=0)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 5, 2)
    assert stats.accepted_per_pos == [1, 1, 0]
    assert stats.acceptance_rate == 0.4 and stats.mean_accepted_length == 2.0


def test_token_arrays_follow_the_requests_tokens() -> None:
    arrays = drafts.TokenArrays()
    request = decoding(n_prompt=3, n_out=1)
    assert arrays.of(request).tolist() == [1, 2, 3, 7]
    request.append_output_token_ids(list(range(100)))  # past the first buffer: it grows
    assert arrays.of(request).tolist() == request.all_token_ids
    request.truncate_output(2)  # a stop string cut the outputs: rebuilt
    assert arrays.of(request).tolist() == request.all_token_ids == [1, 2, 3, 7, 0]
    arrays.keep_only(set())
    assert arrays._arrays == {}


def test_token_arrays_of_a_reused_request_id_start_again() -> None:
    """An id reused by a new request (while the policy paused, keep_only did not run) gets its own tokens."""
    arrays = drafts.TokenArrays()
    old = decoding(n_prompt=3, n_out=1)
    arrays.of(old)
    new = decoding(n_prompt=6, n_out=2)  # [1 .. 6, 7, 7]: longer, and differs at index 3
    assert new.request_id == old.request_id
    assert arrays.of(new).tolist() == new.all_token_ids


def test_propose_drafts_without_a_policy_gives_every_request_up_to_max_drafts() -> None:
    class Echo:  # drafts 9s, as many as allowed
        def propose(self, token_ids, max_drafts):
            return [[9] * m for m in max_drafts]
    requests = [decoding(max_tokens=100), decoding(max_tokens=5), decoding(presence_penalty=0.5)]
    for i, request in enumerate(requests):
        request.request_id = f"r{i}"
    arrays = drafts.TokenArrays()
    drafts.propose_drafts(Echo(), requests, 3, 100, arrays)
    assert [r.spec_token_ids for r in requests] == [[9, 9, 9], [9, 9], []]
    assert set(arrays._arrays) == {"r0", "r1"}  # kept for every running request, made for those asked

"""The worker's copies of its requests follow the step messages; penalty counts follow the samples."""
from __future__ import annotations

import pytest
import torch

from lamina.layers.sampling_metadata import penalty_tensors
from lamina.sampling_params import SamplingParams
from lamina.step import CachedRequestData, Guess, ModelRunnerOutput, NewRequestData, SchedulerOutput
from lamina.worker.batch_state import BatchState
from lamina.worker.penalty_state import PenaltyState

CPU = torch.device("cpu")
VOCAB = 16


def new_req(req_id: str, prompt: list[int], output: list[int] | None = None, blocks: list[int] | None = None,
            **params) -> NewRequestData:
    return NewRequestData(req_id, prompt, output or [], SamplingParams(**params), frozenset({0}), blocks or [1], 0)


def message(news: list[NewRequestData] = (), cached: CachedRequestData | None = None, **fields) -> SchedulerOutput:
    req_ids = [n.req_id for n in news] + (cached.req_ids if cached else [])
    return SchedulerOutput(req_ids=req_ids, num_scheduled_tokens={r: 1 for r in req_ids}, new_reqs=list(news),
                           cached_reqs=cached or CachedRequestData(), **fields)


def test_new_requests_are_copied_and_cached_ones_take_their_block_changes():
    states = BatchState(PenaltyState(VOCAB, CPU))
    prompt = [3, 4, 5]
    states.apply(message([new_req("a", prompt, output=[6], blocks=[2, 3])]))
    prompt.append(99)  # the worker's copy is its own
    assert states["a"].token_ids == [3, 4, 5, 6] and states["a"].num_output_tokens == 1
    cached = CachedRequestData()
    cached.append("a", 4, 2, [7])  # append a block
    states.apply(message(cached=cached))
    assert states["a"].block_ids == [2, 3, 7] and states["a"].num_computed_tokens == 4
    cached = CachedRequestData()
    cached.append("a", 5, 1, [8, 7])  # the prefix cache swapped block 1 for its cached twin
    states.apply(message(cached=cached))
    assert states["a"].block_ids == [2, 8, 7]


def test_samples_are_recorded_and_drops_come_before_adds():
    states = BatchState(PenaltyState(VOCAB, CPU))
    states.apply(message([new_req("a", [1, 2]), new_req("b", [3])]))
    states.record(ModelRunnerOutput(sampled_token_ids={"a": [9], "gone": [1]}))
    assert states["a"].token_ids == [1, 2, 9] and states["b"].token_ids == [3]
    # "a" finished and its id was reused by a new request in the same message
    states.apply(message([new_req("a", [5])], finished_req_ids=["a"], preempted_req_ids=["b"]))
    assert states["a"].token_ids == [5] and len(states) == 1
    with pytest.raises(ValueError, match="new_reqs"):
        states.apply(message([new_req("a", [5])]))
    cached = CachedRequestData()
    cached.append("b", 1, 0, [])
    with pytest.raises(ValueError, match="cached_reqs"):
        states.apply(message(cached=cached))


def test_a_step_launched_on_a_guess_records_only_the_rows_whose_guess_held():
    """Both requests had [1, 2] when the guessed step was launched; the step before it gave "a" exactly the guessed
    [7, 8] and "b" [7, 5]: "a" takes the guessed step's tokens, "b" (void) does not."""
    states = BatchState(PenaltyState(VOCAB, CPU))
    states.apply(message([new_req("a", [1, 2]), new_req("b", [1, 2])]))
    states.record(ModelRunnerOutput(sampled_token_ids={"a": [7, 8], "b": [7, 5]}))
    guesses = {"a": Guess(2, [7, 8]), "b": Guess(2, [7, 8])}
    states.record(ModelRunnerOutput(sampled_token_ids={"a": [9, 10], "b": [11]}), guesses)
    assert states["a"].token_ids == [1, 2, 7, 8, 9, 10] and states["b"].token_ids == [1, 2, 7, 5]
    assert Guess(2, [7, 8]).held_by([1, 2, 7, 8]) and not Guess(2, [7, 8]).held_by([1, 2, 7, 8, 9])


def test_incremental_penalty_counts_equal_counts_rebuilt_from_the_token_lists():
    """The oracle: penalty_tensors from lists, as the sampler got them before the worker kept state."""
    states = BatchState(PenaltyState(VOCAB, CPU))
    requests = {  # 9 penalised requests: the rows grow past their first 8
        **{f"p{i}": new_req(f"p{i}", [i, i + 1], output=[2, 2, i], frequency_penalty=0.5,
                            repetition_penalty=1.0 + 0.1 * (i % 2)) for i in range(9)},
        "plain": new_req("plain", [1, 2, 3]),
    }
    states.apply(message(list(requests.values())))
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        req_ids = list(states.requests)
        sampled = torch.randint(0, VOCAB, (len(req_ids),), generator=generator)
        states.penalties.update(req_ids, sampled)
        states.record(ModelRunnerOutput(sampled_token_ids={r: [int(t)] for r, t in zip(req_ids, sampled)}))
    states.apply(message(finished_req_ids=["p3"]))  # its row is recycled by the next request with penalties
    states.apply(message([new_req("late", [7], output=[4, 4], presence_penalty=1.0)]))
    req_ids = list(states.requests)
    params = [states[r].sampling_params for r in req_ids]
    got = states.penalties.tensors(req_ids, params)
    want = penalty_tensors(params, [states[r].token_ids[:states[r].num_prompt_tokens] for r in req_ids],
                           [states[r].output_token_ids for r in req_ids], VOCAB, CPU)
    assert torch.equal(got.output_token_counts, want.output_token_counts)
    assert torch.equal(got.prompt_token_mask, want.prompt_token_mask)
    assert torch.equal(got.frequency_penalties, want.frequency_penalties)
    assert states.penalties.tensors(["plain"], [states["plain"].sampling_params]) is None

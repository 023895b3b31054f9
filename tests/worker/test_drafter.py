"""Drafter: a worker-side proposer's drafts stay on the device, their counts join the step's answer, and the
next step takes them from the device; a proposer that raises drops only them."""
from __future__ import annotations

import torch

import pytest

from lamina import LLM
from lamina.sampling_params import SamplingParams
from lamina.spec.model_proposer import Drafts
from lamina.step import DRAFT_ON_DEVICE, ModelRunnerOutput, NewRequestData, SchedulerOutput
from lamina.worker.batch_state import BatchState
from lamina.worker.drafter import Drafter
from lamina.worker.penalty_state import PenaltyState
from tests.helpers.tiny_models import make_tiny_model


class Proposer:
    def __init__(self, fail: bool, uses_hidden: bool = True) -> None:
        self.fail, self.uses_hidden, self.forgotten, self.asked = fail, uses_hidden, [], []

    def propose(self, requests, hidden):  # noqa: ANN001, ANN201
        self.asked.append([(r.req_id, list(r.token_ids), r.num_drafts, hidden.tolist()) for r in requests])
        if self.fail:
            raise RuntimeError("out of memory in the draft (simulated)")
        # request i drafts 10 * i + 1, 10 * i + 2, ... (rows in reverse order, one row wider than needed)
        width = max(r.num_drafts for r in requests) + 1
        rows = [[10 * i + j + 1 for j in range(width)] for i in range(len(requests))][::-1]
        return Drafts(torch.tensor(rows), [len(requests) - 1 - i for i in range(len(requests))],
                      [r.num_drafts for r in requests])

    def forget(self, req_ids) -> None:  # noqa: ANN001
        self.forgotten += list(req_ids)


def _states() -> BatchState:
    states = BatchState(PenaltyState(16, torch.device("cpu")))
    new = NewRequestData("a", [1, 2, 3], [], SamplingParams(), frozenset(), block_ids=[1, 2], num_computed_tokens=0)
    states.apply(SchedulerOutput(req_ids=["a"], num_scheduled_tokens={"a": 3}, new_reqs=[new]))
    return states


def test_drafts_follow_the_newest_token_and_stay_inside_the_blocks() -> None:
    states, proposer = _states(), Proposer(fail=False)
    output = ModelRunnerOutput(sampled_token_ids={"a": [4]})
    states.record(output)  # tokens 1 2 3 4: N = 4, blocks of 4 cover positions [0, 8)
    hidden = torch.arange(6.0).view(3, 2)  # three sampling rows; "a"'s starts at row 1
    drafter = Drafter(proposer, block_size=4)
    drafter.draft({"a": 3}, output, states, hidden, {"a": 1})
    assert output.num_drafts == {"a": 3}
    assert proposer.asked == [[("a", [1, 2, 3, 4], 3, [[2.0, 3.0]])]]
    patch = drafter.take(["a"], [2], rows=[5, 6])  # the first ones when the engine schedules fewer
    assert patch.values.tolist() == [1, 2] and patch.index.tolist() == [5, 6]
    ids = torch.zeros(8, dtype=torch.int64)
    patch.apply(ids)
    assert ids.tolist() == [0, 0, 0, 0, 0, 1, 2, 0]
    with pytest.raises(RuntimeError, match="'a': 1 draft"):  # taken: no longer held
        drafter.take(["a"], [1], rows=[0])


def test_a_proposer_that_reads_no_hidden_state_gets_none() -> None:
    states, proposer = _states(), Proposer(fail=False, uses_hidden=False)
    output = ModelRunnerOutput(sampled_token_ids={"a": [4]})
    states.record(output)
    Drafter(proposer, block_size=4).draft({"a": 2}, output, states, torch.arange(6.0).view(3, 2), {"a": 1})
    assert output.num_drafts == {"a": 2}
    assert proposer.asked == [[("a", [1, 2, 3, 4], 2, [])]]


def test_a_failing_proposer_drops_its_drafts_only() -> None:
    states, proposer = _states(), Proposer(fail=True)
    output = ModelRunnerOutput(sampled_token_ids={"a": [4]})
    states.record(output)
    Drafter(proposer, block_size=4).draft({"a": 2}, output, states, torch.zeros(1, 2), {"a": 0})
    assert output.num_drafts == {} and output.sampled_token_ids == {"a": [4]}
    assert proposer.forgotten == ["a"]  # its draft KV may be half written


def test_take_gathers_the_drafts_of_several_calls_in_the_order_asked() -> None:
    drafter = Drafter(Proposer(fail=False), block_size=4)
    first = Drafts(torch.tensor([[5, 6, 0], [7, 8, 9]]), rows=[1, 0, 0], counts=[3, 2, 0])  # c: none
    second = Drafts(torch.tensor([[40, 41]]), rows=[0], counts=[2])
    drafter.held = {"a": (first, 0), "b": (first, 1), "c": (first, 2), "d": (second, 0)}
    assert drafter.take(["d", "a", "b"], [1, 3, 2], rows=list(range(6))).values.tolist() == [40, 7, 8, 9, 5, 6]
    with pytest.raises(RuntimeError, match="'c': 1 draft.* 0 held"):
        drafter.take(["c"], [1], rows=[0])
    drafter.held["e"] = (second, 0)
    drafter.forget(["e"])
    with pytest.raises(RuntimeError, match="'e'"):
        drafter.take(["e"], [1], rows=[0])


def test_drafts_on_the_device_need_a_worker_side_proposer(tmp_path) -> None:  # noqa: ANN001
    llm = LLM(model=str(make_tiny_model("llama", tmp_path / "m", vocab_size=64)), skip_tokenizer_init=True,
              block_size=4, num_kv_blocks=16)  # no speculative_config: no drafter
    new = NewRequestData("a", [1, 2, 3], [], SamplingParams(), frozenset(), block_ids=[1, 2], num_computed_tokens=0)
    message = SchedulerOutput(req_ids=["a"], num_scheduled_tokens={"a": 5}, new_reqs=[new],
                              scheduled_spec_decode_tokens={"a": [DRAFT_ON_DEVICE] * 2})
    with pytest.raises(ValueError, match="scheduled_spec_decode_tokens: DRAFT_ON_DEVICE"):
        llm.engine.executor.worker.execute_model(message)

"""The sampling calls a step's graph keys its rows by: the drafting rows first (salted), then the plain rows, as the
model runner makes them (lamina/worker/graph_sampling.py's diagram)."""
from __future__ import annotations

from lamina.worker.graph_sampling import sampling_calls, split_by_drafts, verify_positions
from lamina.worker.input_batch import HostBatch


def test_the_diagrams_step_splits_into_its_two_calls() -> None:
    host = HostBatch(input_ids=[], positions=[], slot_mapping=[], query_start_loc=[], seq_lens=[], block_tables=[],
                     logits_indices=list(range(6)), sampling_req_ids=["a", "b", "c"], sample_positions=[10, 20, 30],
                     num_draft_tokens=[2, 0, 1])
    assert split_by_drafts(host.sampling_req_ids, host.num_draft_tokens) == (
        ["b"], [3], ["a", "c"], [0, 1, 2, 4, 5], [2, 1])
    assert sampling_calls(host, None) == [([0, 1, 2, 4, 5], ["a", "a", "a", "c", "c"], [10, 11, 12, 30, 31], True),
                                          ([3], ["b"], [20], False)]


def test_tree_rows_sample_at_their_depth() -> None:
    class Tree:  # a DraftTree's depths: nodes 0 and 1 at depth 1, node 2 at depth 2
        depths = [1, 1, 2]

    assert verify_positions([10, 40], [3, 1], Tree()) == [10, 11, 11, 12, 40, 41]
    assert verify_positions([10], [2], None) == [10, 11, 12]

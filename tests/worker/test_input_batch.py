"""The flat batch layout: positions, slot mapping, offsets, which rows produce logits."""
from __future__ import annotations

import pytest
import torch

from lamina.sampling_params import SamplingParams
from lamina.step import Guess, NewRequestData, SchedulerOutput
from lamina.worker.batch_state import BatchState
from lamina.worker.input_batch import plan_batch, to_device
from lamina.worker.penalty_state import PenaltyState

CPU = torch.device("cpu")


def new_req(req_id: str, prompt: list[int], blocks: list[int], computed: int, output: list[int] | None = None,
            ) -> NewRequestData:
    return NewRequestData(req_id, prompt, output or [], SamplingParams(), frozenset(), blocks, computed)


def build(news: list[NewRequestData], counts: dict[str, int], block_size: int, **fields):
    states = BatchState(PenaltyState(100, CPU))
    scheduled = SchedulerOutput(req_ids=[n.req_id for n in news], num_scheduled_tokens=counts, new_reqs=news,
                                **fields)
    states.apply(scheduled)
    host = plan_batch(scheduled, states, block_size)
    return host, to_device(host, CPU)


def test_chunk_and_decode_layout():
    prefill = new_req("p", list(range(10, 20)), [5, 9], computed=4)  # 10 prompt tokens, chunk [4, 8)
    decode = new_req("d", [1, 2, 3], [2], computed=3, output=[77])
    host, batch = build([prefill, decode], {"p": 4, "d": 1}, block_size=4)
    assert batch.input_ids.tolist() == [14, 15, 16, 17, 77]
    assert batch.positions.tolist() == [4, 5, 6, 7, 3]
    # position 4..7 of "p" live in its second block (9): slots 36..39; "d" position 3 in block 2: slot 11
    assert batch.attn_metadata.slot_mapping.tolist() == [36, 37, 38, 39, 11]
    assert batch.attn_metadata.query_start_loc_cpu == [0, 4, 5]
    assert batch.attn_metadata.seq_lens_cpu == [8, 4]
    assert batch.attn_metadata.block_tables.tolist() == [[5, 9], [2, 0]]
    # the prefill chunk has not reached its last prompt token: only the decode samples, the token at index 4
    assert batch.logits_indices.tolist() == [4] and host.sampling_req_ids == ["d"] and host.sample_positions == [4]


def test_drafts_follow_the_verified_tokens_and_a_decode_ahead_step_always_samples():
    verify = new_req("v", [1, 2, 3], [4], computed=3, output=[50])  # verifies token 50 + drafts 60, 61
    host, _ = build([verify], {"v": 3}, block_size=8, scheduled_spec_decode_tokens={"v": [60, 61]})
    assert host.input_ids == [50, 60, 61] and host.positions == [3, 4, 5] and host.sampling_req_ids == ["v"]
    ahead = new_req("a", [1, 2, 3], [4], computed=4, output=[50])  # position 4: the token in flight
    host, _ = build([ahead], {"a": 1}, block_size=8, decode_ahead=True)
    assert host.input_ids == [0] and host.positions == [4] and host.sampling_req_ids == ["a"]


def test_a_step_launched_on_a_guess_reads_its_inputs_from_the_guess():
    """The step in flight verifies 50 + drafts [60, 61] (positions 3..5) and has not been read; the step launched on
    the guess that both are accepted and 62 follows computes 62 (position 6) and verifies the drafts [63, 64]."""
    guessed = new_req("g", [1, 2, 3], [4, 5], computed=6, output=[50])
    host, _ = build([guessed], {"g": 3}, block_size=8, scheduled_spec_decode_tokens={"g": [63, 64]},
                    guesses={"g": Guess(4, [60, 61, 62])})
    assert host.input_ids == [62, 63, 64] and host.positions == [6, 7, 8]
    assert host.sampling_req_ids == ["g"] and host.num_draft_tokens == [2] and host.sample_positions == [7]
    assert host.logits_indices == [0, 1, 2] and host.draft_token_ids == [63, 64]
    with pytest.raises(ValueError, match="guesses"):  # the worker's tokens must end where the guess starts
        build([guessed], {"g": 3}, block_size=8, scheduled_spec_decode_tokens={"g": [63, 64]},
              guesses={"g": Guess(5, [61, 62])})


def test_every_device_field_is_16_byte_aligned():
    """Triton specializes kernels on pointer alignment: a field whose alignment changed with the batch
    would compile a new variant mid-run."""
    for num_seqs in range(1, 6):
        news = [new_req(f"r{i}", list(range(1, 4 + i)), [i + 1], computed=0) for i in range(num_seqs)]
        lengths = [len(n.prompt_token_ids) for n in news]
        _, batch = build(news, {n.req_id: k for n, k in zip(news, lengths)}, block_size=16)
        md = batch.attn_metadata
        tensors = [batch.input_ids, batch.positions, batch.logits_indices, md.slot_mapping, md.query_start_loc,
                   md.seq_lens, md.block_tables]
        assert all(t.data_ptr() % 16 == 0 for t in tensors), num_seqs
        assert batch.positions.tolist() == [p for k in lengths for p in range(k)]
        assert md.seq_lens.tolist() == lengths
        assert md.block_tables.tolist() == [[i + 1] for i in range(num_seqs)]
        assert batch.logits_indices.tolist() == [md.query_start_loc_cpu[i + 1] - 1 for i in range(num_seqs)]

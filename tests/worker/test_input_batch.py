"""The flat batch layout: positions, slot mapping, offsets, which rows produce logits."""
from __future__ import annotations

import torch

from lamina.engine.interfaces import SchedulerOutput
from lamina.engine.request import Request
from lamina.sampling_params import SamplingParams
from lamina.worker.input_batch import build_input_batch


def test_chunk_and_decode_layout():
    prefill = Request("p", list(range(10, 20)), SamplingParams())  # 10 prompt tokens, chunk [4, 8)
    prefill.num_computed_tokens, prefill.block_ids = 4, [5, 9]
    decode = Request("d", [1, 2, 3], SamplingParams())
    decode.append_output_token_ids([77])
    decode.num_computed_tokens, decode.block_ids = 3, [2]
    batch = build_input_batch(SchedulerOutput([prefill, decode], {"p": 4, "d": 1}), block_size=4,
                              device=torch.device("cpu"))
    assert batch.input_ids.tolist() == [14, 15, 16, 17, 77]
    assert batch.positions.tolist() == [4, 5, 6, 7, 3]
    # position 4..7 of "p" live in its second block (9): slots 36..39; "d" position 3 in block 2: slot 11
    assert batch.attn_metadata.slot_mapping.tolist() == [36, 37, 38, 39, 11]
    assert batch.attn_metadata.query_start_loc_cpu == [0, 4, 5]
    assert batch.attn_metadata.seq_lens_cpu == [8, 4]
    assert batch.attn_metadata.block_tables.tolist() == [[5, 9], [2, 0]]
    # the prefill chunk has not reached its last prompt token: only the decode samples
    assert batch.logits_indices.tolist() == [4] and batch.sampling_requests == [decode]


def test_every_device_field_is_16_byte_aligned():
    """Triton specializes kernels on pointer alignment: a field whose alignment changed with the batch
    would compile a new variant mid-run."""
    for num_seqs in range(1, 6):
        requests, counts = [], {}
        for i in range(num_seqs):
            r = Request(f"r{i}", list(range(1, 4 + i)), SamplingParams())
            r.block_ids = [i + 1]
            requests.append(r)
            counts[r.request_id] = r.num_tokens
        batch = build_input_batch(SchedulerOutput(requests, counts), block_size=16, device=torch.device("cpu"))
        md = batch.attn_metadata
        tensors = [batch.input_ids, batch.positions, batch.logits_indices, md.slot_mapping, md.query_start_loc,
                   md.seq_lens, md.block_tables]
        assert all(t.data_ptr() % 16 == 0 for t in tensors), num_seqs
        assert batch.positions.tolist() == [p for r in requests for p in range(r.num_tokens)]
        assert md.seq_lens.tolist() == [r.num_tokens for r in requests]
        assert md.block_tables.tolist() == [[i + 1] for i in range(num_seqs)]
        assert batch.logits_indices.tolist() == [md.query_start_loc_cpu[i + 1] - 1 for i in range(num_seqs)]

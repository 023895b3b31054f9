"""The host-side layout helpers of the draft loops (lamina/spec/draft_loop.py, lamina/spec/eagle_loop.py) and the
choice of a call's loop (DraftLoops)."""
from __future__ import annotations

import numpy as np
import torch

from lamina.spec.draft_loop import WIDE_TOKENS, DraftLoops, block_table, slot_mapping, step_rows, wide_shapes
from lamina.spec.eagle_loop import CatchUpRow, _flat_rows


def test_block_table_pads_ragged_rows_with_the_null_block() -> None:
    table = block_table([[3, 5], [7], [2, 4, 6], [9]])
    assert table.dtype == np.int32
    assert table.tolist() == [[3, 5, 0], [7, 0, 0], [2, 4, 6], [9, 0, 0]]
    assert block_table([(1, 2), (3, 4)]).tolist() == [[1, 2], [3, 4]]


def test_slot_mapping_reads_each_tokens_block() -> None:
    table = block_table([[3, 5], [7]])
    slots = slot_mapping(table, np.array([0, 0, 1]), np.array([15, 16, 2]), block_size=16)
    assert slots.tolist() == [3 * 16 + 15, 5 * 16 + 0, 7 * 16 + 2]


def test_flat_rows_lays_out_each_rows_positions() -> None:
    rows = [CatchUpRow("a", [0] * 20, [1], start=4, count=3, limit=2, index=0),
            CatchUpRow("b", [0] * 20, [2], start=9, count=1, limit=1, index=2),
            CatchUpRow("c", [0] * 20, [3], start=0, count=2, limit=3, index=1)]
    starts, positions, row_of = _flat_rows(rows)
    assert starts.tolist() == [0, 3, 4, 6]
    assert positions.tolist() == [4, 5, 6, 9, 0, 1]
    assert row_of.tolist() == [0, 0, 0, 1, 2, 2]
    assert [r.base for r in rows] == [6, 9, 1]


def test_step_rows_feed_each_draft_after_the_base_and_store_nothing_past_the_limit() -> None:
    table = block_table([[3, 5, 6], [7, 8], [0]]).astype(np.int64)  # row 2: a padding row (base 0, limit 0)
    rows = step_rows(table, base=np.array([14, 3, 0]), limit=np.array([3, 1, 0]), k=4, block_size=8)
    assert rows.shape == (3, 3, 3)  # steps 1..3, (pos, slot, seq), rows
    pos, slot, seq = rows[:, 0], rows[:, 1], rows[:, 2]
    assert pos.tolist() == [[15, 3, 0], [16, 3, 0], [14, 3, 0]]  # row 0 drafts 3: steps 1, 2; then its base
    assert slot.tolist() == [[5 * 8 + 7, -1, -1], [6 * 8 + 0, -1, -1], [-1, -1, -1]]
    assert seq.tolist() == (pos + 1).tolist()


def test_wide_loops_cover_long_catch_ups_in_a_fixed_number_of_token_slots() -> None:
    assert WIDE_TOKENS == 1024
    assert wide_shapes(3, 256, 1024) == [(1, 1024), (2, 512), (4, 256), (8, 128), (16, 64), (32, 32), (64, 16),
                                         (128, 8)]  # 256 rows: 4 tokens a row, the narrow loop's
    assert wide_shapes(7, 256, 2048) == [(1, 1024), (2, 512), (4, 256), (8, 128), (16, 64), (32, 32), (64, 16)]
    assert wide_shapes(3, 24, 1024) == [(1, 1024), (2, 512), (4, 256), (8, 128), (16, 64), (24, 42)]
    assert wide_shapes(3, 8, 64) == [(8, 64)]  # max_model_len caps a row; one loop per distinct length
    assert wide_shapes(3, 4, 64, wide_tokens=16) == [(1, 16), (2, 8)]
    assert wide_shapes(7, 1, 8) == []  # no catch-up is longer than the narrow loop's k + 1


def test_a_call_replays_the_narrow_loop_unless_a_catch_up_is_longer() -> None:
    loops = DraftLoops(None, 3, 16, 512, 16, torch.device("cpu"))
    # one row and two rows both take 512 tokens (max_model_len): one loop, for two rows
    assert [(w.buckets, w.query_len) for w in loops.wide] == [([2], 512), ([4], 256), ([8], 128), ([16], 64)]
    assert loops.pick(5, 4, 3, longest=4) is loops.narrow
    assert loops.pick(1, 4, 3, longest=5) is loops.wide[0]
    assert loops.pick(3, 4, 3, longest=300) is loops.wide[1]  # the fewest rows that hold 3; longer rows: eager
    assert loops.pick(16, 4, 3, longest=20) is loops.wide[3]
    assert loops.pick(17, 4, 3, longest=20) is None  # more rows than any graph
    assert loops.pick(2, 33, 3, longest=20) is None  # a block table wider than max_model_len
    assert loops.pick(2, 4, 4, longest=2) is None  # more drafts than k

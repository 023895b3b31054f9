"""The host-side layout helpers of the draft loops (lamina/spec/draft_loop.py, lamina/spec/eagle_loop.py)."""
from __future__ import annotations

import numpy as np

from lamina.spec.draft_loop import block_table, slot_mapping
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

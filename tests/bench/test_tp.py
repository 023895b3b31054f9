"""lamina.bench.tp --dry-run: TP 1 and 2 over gloo on the tiny shape, each row with its own rank-0 weight bytes."""
from __future__ import annotations

import json

from lamina.bench import tp


def test_dry_run_measures_tp1_and_tp2(tmp_path, capsys) -> None:
    result = tmp_path / "tp.json"
    assert tp.main(["--workload", "w2", "--dry-run", "--result-file", str(result)]) == 0
    rows = json.loads(result.read_text())["rows"]
    assert [r["tensor_parallel_size"] for r in rows] == [1, 2]
    one, two = rows
    assert two["rank0_weight_bytes"] < 0.6 * one["rank0_weight_bytes"]  # each rank holds about half the weights
    assert all(r["decode_tok_per_s"] > 0 for r in rows) and one["speedup_vs_first"] == 1.0
    assert two["kv_capacity_tokens"] > one["kv_capacity_tokens"]  # the KV cache is sized per rank: heads split
    assert "tensor_parallel_size" in capsys.readouterr().out  # the table, printed last

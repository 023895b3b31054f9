"""lamina.bench.kv_fp8 on a tiny model: three sets of fp8 KV scales against the model's dtype, in one JSON."""
from __future__ import annotations

import json

from lamina.bench import kv_fp8
from tests.quant.helpers import tiny_model


def test_three_sets_of_scales_are_compared_with_the_models_dtype(tmp_path, capsys) -> None:
    model = tiny_model(tmp_path / "m")
    out = tmp_path / "kv.json"
    assert kv_fp8.main(["--model", str(model), "--windows", "3", "--result-file", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert len(rows) == 3 and "every scale 1.0" in rows
    for row in rows.values():
        auto, fp8 = row["kv_blocks_auto"], row["kv_blocks_fp8"]
        assert row["tokens_scored"] > 0 and 4 * auto <= fp8 < 4 * (auto + 1)  # float32 -> e4m3, same bytes
        assert row["greedy_prompts"] == 24 and row["mean_abs_logprob_diff"] > 0
    assert "every scale 1.0" in capsys.readouterr().out

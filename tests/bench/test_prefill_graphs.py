"""lamina.bench.prefill_graphs on CPU (no graphs there: both engines prefill eagerly): it runs, times every prompt
length for both settings, and writes its JSON."""
from __future__ import annotations

import json

from lamina.bench import prefill_graphs


def test_the_bench_times_both_settings_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "prefill.json"
    assert prefill_graphs.main(["--models", "tiny", "--prompt-lens", "8,20", "--repeats", "2",
                                "--result-file", str(out)]) == 0
    report = json.loads(out.read_text())
    ttft = report["models"]["tiny"]["ttft_ms"]
    assert set(ttft) == {"0", str(prefill_graphs.DEFAULT_SLOTS)} and prefill_graphs.DEFAULT_SLOTS > 0
    assert all(set(row) == {"8", "20"} and all(ms > 0 for ms in row.values()) for row in ttft.values())
    assert "greedy_identical" not in report["models"]["tiny"]  # the demo model's check only
    assert "tiny" in capsys.readouterr().out

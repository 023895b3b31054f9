"""lamina.bench.quant_accuracy on the demo model, two rows and a short evaluation: each row is what
`lamina quantize` wrote in its summary, the W8A8 row also scored against int8, the table printed last."""
from __future__ import annotations

import json

import pytest

from lamina.bench import quant_accuracy


def test_rows_come_from_each_runs_summary(tmp_path, capsys) -> None:
    result, work = tmp_path / "acc.json", tmp_path / "work"
    assert quant_accuracy.main(["--methods", "int8,w8a8", "--code-cases", "4", "--max-eval-tokens", "600",
                                "--work-dir", str(work), "--result-file", str(result)]) == 0
    report = json.loads(result.read_text())
    int8, w8a8 = report["rows"]
    for row in (int8, w8a8):
        summary = json.loads((work / row["label"] / "quantize_summary.json").read_text())
        assert row["ppl"] == summary["evaluation"]["perplexity"] and row["code_cases"] == 4
        assert summary["evaluation"]["tokens"] <= 600
    assert report["unquantized"]["ppl"] == int8["ppl_baseline"] == w8a8["ppl_baseline"]
    assert 0 < int8["kl"] < w8a8["kl"]  # quantizing the activations costs more than int8 weights alone
    assert 0 < w8a8["kl_vs_int8"] and "kl_vs_int8" not in int8
    out = capsys.readouterr().out
    assert out.index("| `int8` |") < out.index("| `w8a8` |")
    with pytest.raises(SystemExit):  # a work directory that holds checkpoints already is refused
        quant_accuracy.main(["--methods", "int8", "--work-dir", str(work)])

"""The projection bench on the tiny shape: step times measured, speed-ups by the module's arithmetic."""
from __future__ import annotations

import json

import pytest

from lamina.bench.spec_projection import expected_tokens, main


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 3) == 1 and expected_tokens(1.0, 3) == 4
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_projection_writes_its_arithmetic(tmp_path) -> None:
    out = tmp_path / "p.json"
    assert main(["--shape", "tiny", "--context", "32", "--repeats", "2", "--acceptance", "ngram=0.5,0.8",
                 "--result-file", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["decode_ms"] > 0 and report["verify_ms"] > 0
    assert [r["method"] for r in report["rows"]] == ["ngram", "a=0.8"]
    for row in report["rows"]:
        free = row["tokens_per_verify"] * report["decode_ms"] / report["verify_ms"]
        assert row["speedup_free_drafts"] == pytest.approx(free)
        assert row["speedup_eagle_head"] < row["speedup_free_drafts"]

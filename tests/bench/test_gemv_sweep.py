"""GEMV sweep: the dry run end to end on one tiny shape (interpreter), with --rows; bad --rows name the flag."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lamina.bench import gemv_sweep


@pytest.fixture
def one_tiny_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    gemv_sweep.use_interpreter()
    monkeypatch.setattr(gemv_sweep, "DRY_SHAPES", {"tiny": [("a", 8, 64)]})


def test_rows_above_one_time_the_default_config_against_cublas(one_tiny_shape: None, tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    assert gemv_sweep.main(["--dry-run", "--rows", "2", "--result-file", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["m"] == [2]
    [row] = report["rows"]
    assert (row["m"], row["n"], row["k"]) == (2, 8, 64)
    assert [c["default"] for c in row["configs"]] == [True]  # the default config alone
    assert row["configs"][0]["ok"] and row["failed"] == []  # checked against F.linear on 2 rows


@pytest.mark.parametrize("rows", ["0", "9", "two"])
def test_bad_rows_are_refused_naming_the_flag(one_tiny_shape: None, rows: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gemv_sweep.main(["--dry-run", "--rows", rows])
    assert "--rows" in capsys.readouterr().err

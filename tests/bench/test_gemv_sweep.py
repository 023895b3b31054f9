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


def test_shape_sets_come_from_the_models_configs() -> None:
    assert gemv_sweep.shape_set("demo") == [("qkv", 640, 384), ("o_proj", 384, 384), ("gate_up", 2048, 384),
                                            ("down", 384, 1024), ("lm_head", 8192, 384)]
    assert gemv_sweep.shape_set("qwen3-0.6b") == [("qkv", 4096, 1024), ("o_proj", 1024, 2048),
                                                  ("gate_up", 6144, 1024), ("down", 1024, 3072),
                                                  ("lm_head", 151936, 1024)]
    assert gemv_sweep.shape_set("llama3-8b")[2:] == [("gate_up", 28672, 4096), ("down", 4096, 14336),
                                                     ("lm_head", 128256, 4096)]


@pytest.mark.parametrize("rows", ["0", "9", "two"])
def test_bad_rows_are_refused_naming_the_flag(one_tiny_shape: None, rows: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gemv_sweep.main(["--dry-run", "--rows", rows])
    assert "--rows" in capsys.readouterr().err

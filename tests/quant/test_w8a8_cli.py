"""`lamina quantize --method llm_int8|w8a8|smoothquant|fp8`: each writes its format through the gate;
smoothquant's table and summary carry w8a8's evaluation; --alpha is checked, in process."""
from __future__ import annotations

import json

import pytest

from lamina.cli import main
from tests.quant.helpers import tiny_model
from tests.quant.test_calibrated_cli import LOOSE
from tests.quant.test_quant_cli import TEXT


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("cli") / "fp32")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    (root / "heldout.py.txt").write_text(TEXT)
    lines = [{"text": f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 24} for i in range(12)]
    (root / "calib.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(root / "heldout.py.txt"), str(root / "calib.jsonl")


def _quantize(model, out, files, method: str, *extra: str) -> int:
    text, calib = files
    calibration = ["--calib", calib, "--num-samples", "4"] if method == "smoothquant" else []
    return main(["quantize", str(model), "--method", method, "--output", str(out), "--eval-text", text,
                 "--window", "64", "--no-progress", *calibration, *extra])


@pytest.mark.parametrize("method,fmt,marker", [("llm_int8", "pack-quantized", True), ("w8a8", "int-quantized", False),
                                               ("fp8", "float-quantized", False)])
def test_uncalibrated_w8a8_methods_write_their_format(model, files, tmp_path, method, fmt, marker):
    out = tmp_path / "q"
    assert _quantize(model, out, files, method, *LOOSE) == 0
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == fmt and ("lamina_llm_int8" in config) == marker
    summary = json.loads((out / "quantize_summary.json").read_text())
    assert summary["method"] == method and summary["passed"] and summary["quantized_layers"] == 14


def test_smoothquant_shows_w8a8_beside_it_without_having_to_beat_it(model, files, tmp_path, capsys):
    out = tmp_path / "q"
    assert _quantize(model, out, files, "smoothquant", "--alpha", "0.6", *LOOSE, "--force") == 0
    table = capsys.readouterr().out
    assert "w8a8" in table.splitlines()[0] and "smoothquant" in table.splitlines()[0]
    summary = json.loads((out / "quantize_summary.json").read_text())
    assert summary["reference"]["method"] == "w8a8" and summary["calibration"]["alpha"] == 0.6
    assert summary["reference"]["must_beat"] is False and "better_than" not in summary["budgets"]
    assert "α=0.6" in summary["calibration"]["layers"]["model.layers.0"] and "< w8a8" not in table


@pytest.mark.parametrize("method,extra,message", [
    ("int8", ["--alpha", "0.5"], "--alpha: int8 uses no calibration data"),
    ("smoothquant", ["--alpha", "1.5"], "--alpha: smoothquant only, within [0, 1]; got 1.5"),
    ("gptq", ["--alpha", "0.5"], "--alpha: smoothquant only"),
    ("fp8", ["--group-size", "64"], "--group-size: fp8 has one scale per output channel"),
])
def test_bad_w8a8_options_are_clear_errors(model, files, tmp_path, capsys, method, extra, message):
    assert _quantize(model, tmp_path / "q", files, method, *extra) == 2
    assert message in capsys.readouterr().err

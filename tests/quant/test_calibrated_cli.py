"""`lamina quantize --method gptq|awq`: calibration options and data, the gate against RTN (a result that is
not better than rtn4 is refused unless --force), the summary, in process."""
from __future__ import annotations

import json

import pytest

from lamina import DEMO_MODEL
from lamina.cli import main
from lamina.loader.tokenizer import Tokenizer
from lamina.quant.rtn import rtn_quantize
from lamina.quantize import methods
from lamina.quantize.calibrate import LINEARS, record_quantized
from lamina.quantize.calibration import (DEFAULT_CALIB_TEXT, DEFAULT_NUM_SAMPLES, DEFAULT_SEQ_LEN,
                                         calibration_sequences, read_calib_texts)
from lamina.quantize.cli import METHODS
from lamina.quantize.evaluate import DEFAULT_EVAL_TEXT, read_eval_texts
from tests.quant.helpers import tiny_model
from tests.quant.test_quant_cli import TEXT

LOOSE = ["--max-ppl-increase", "1000", "--max-kl", "100"]


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
    return main(["quantize", str(model), "--method", method, "--group-size", "64", "--output", str(out),
                 "--eval-text", text, "--window", "64", "--calib", calib, "--num-samples", "6", "--no-progress",
                 *extra])


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_the_gate_measures_rtn4_too_and_the_summary_says_so(model, files, tmp_path, capsys, method):
    out = tmp_path / "q"
    code = _quantize(model, out, files, method, *LOOSE, "--force")
    assert code == 0
    table = capsys.readouterr().out
    assert "rtn4" in table and "and < rtn4" in table
    summary = json.loads((out / "quantize_summary.json").read_text())
    assert summary["method"] == method and summary["budgets"]["better_than"] == "rtn4"
    assert summary["reference"]["method"] == "rtn4" and summary["reference"]["perplexity"] > 1
    assert summary["calibration"]["sequences"] == 6 and summary["calibration"]["text"].endswith("calib.jsonl")
    beats = summary["evaluation"]["perplexity"] < summary["reference"]["perplexity"]
    assert summary["passed"] == beats and summary["weights"]["group_size"] == 64
    assert not list(tmp_path.glob(".*partial*"))


def _rtn_in_disguise(runner, layer, prefix, targets, options, result) -> None:
    """A 'calibrated' method that is plain RTN: exactly as good as rtn4, hence not better."""
    for linear in LINEARS:
        name = f"{prefix}.{linear}"
        weight = layer.get_submodule(linear).weight
        record_quantized(result, runner.model, name, rtn_quantize(weight, targets[name], options.scale_dtype))
    runner.advance(layer)


def test_a_result_not_better_than_rtn_is_refused_unless_forced(model, files, tmp_path, capsys, monkeypatch):
    fake = methods.CalibratedMethod(methods.CALIBRATED["gptq"].recipe, _rtn_in_disguise, methods.gptq_head)
    monkeypatch.setitem(methods.CALIBRATED, "gptq", fake)
    out = tmp_path / "q"
    assert _quantize(model, out, files, "gptq", *LOOSE) == 1
    err = capsys.readouterr().err
    assert "is not better than rtn4's" in err and "gptq must beat rtn4" in err and "nothing written" in err
    assert not out.exists() and not list(tmp_path.iterdir())
    assert _quantize(model, out, files, "gptq", *LOOSE, "--force") == 0
    summary = json.loads((out / "quantize_summary.json").read_text())
    assert summary["forced"] and "not better than rtn4" in summary["failures"][0]


@pytest.mark.parametrize("method,extra,message", [
    ("rtn4", ["--calib", "x.jsonl"], "--calib: rtn4 uses no calibration data"),
    ("int8", ["--num-samples", "4"], "--num-samples: int8 uses no calibration data"),
    ("awq", ["--act-order"], "--act-order: awq has no activation order"),
    ("gptq", ["--calib", "notes.txt"], "--calib: 'notes.txt' is not a .jsonl file"),
    ("gptq", ["--num-samples", "0"], "--num-samples must be a positive integer"),
])
def test_bad_calibration_options_are_clear_errors(model, files, tmp_path, capsys, method, extra, message):
    code = main(["quantize", str(model), "--method", method, "--output", str(tmp_path / "q"),
                 "--eval-text", files[0], *extra])
    assert code == 2 and message in capsys.readouterr().err


def test_the_cli_lists_every_method():
    assert METHODS == methods.all_method_names()


def test_the_default_calibration_text_does_not_overlap_the_evaluation_text():
    calib, heldout = read_calib_texts(DEFAULT_CALIB_TEXT), read_eval_texts(DEFAULT_EVAL_TEXT)
    lines = {line.strip() for text in heldout for line in text.splitlines() if len(line.strip()) > 40}
    shared = [line for text in calib for line in text.splitlines() if line.strip() in lines]
    assert len(calib) >= 10 and not set(calib) & set(heldout) and len(shared) < 5  # a few license lines at most
    sequences = calibration_sequences(calib, Tokenizer.from_pretrained(DEMO_MODEL), DEFAULT_NUM_SAMPLES,
                                      DEFAULT_SEQ_LEN)
    assert len(sequences) == DEFAULT_NUM_SAMPLES and {len(s) for s in sequences} == {DEFAULT_SEQ_LEN}


def test_calibration_sequences_are_cut_and_sampled():
    tokenizer = Tokenizer.from_pretrained(DEMO_MODEL)
    texts = ["def f(x):\n    return x\n" * 40, "import os\n" * 30]
    every = calibration_sequences(texts, tokenizer, 1000, 32)
    few = calibration_sequences(texts, tokenizer, 3, 32)
    assert len(every) > 3 and {len(s) for s in every} == {32} and all(s in every for s in few) and len(few) == 3
    assert len(calibration_sequences(["x = 1\n" * 5], tokenizer, 4, 512)) == 1  # shorter than one sequence
    with pytest.raises(ValueError, match="at least 16 are needed"):
        calibration_sequences(["x"], tokenizer, 4, 512)

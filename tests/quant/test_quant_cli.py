"""`lamina quantize` (the accuracy gate: pass, refuse, --force) and `lamina eval`, in process."""
from __future__ import annotations

import json

import pytest

from lamina.cli import main
from lamina.quantize.evaluate import DEFAULT_EVAL_TEXT, read_eval_texts
from tests.quant.helpers import tiny_model

TEXT = "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i, add(i, i))\n" * 12


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("cli") / "fp32")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "heldout.py.txt"
    path.write_text(TEXT)
    return str(path)


def _quantize(model, out, text, *extra: str) -> int:
    return main(["quantize", str(model), "--method", "rtn4", "--group-size", "64", "--output", str(out),
                 "--eval-text", text, "--window", "64", "--no-progress", *extra])


def test_within_budget_writes_the_checkpoint_and_summary(model, text, tmp_path, capsys):
    out = tmp_path / "q"
    assert _quantize(model, out, text, "--max-ppl-increase", "1000", "--max-kl", "100") == 0
    table = capsys.readouterr().out
    assert "perplexity" in table and "KL (nats/token)" in table and "top-1 agreement" in table
    summary = json.loads((out / "quantize_summary.json").read_text())
    assert summary["passed"] and summary["weights"]["group_size"] == 64 and summary["quantized_layers"] == 14
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == "pack-quantized"
    assert not list(tmp_path.glob(".*partial*"))


def test_over_budget_writes_nothing_and_names_the_metric(model, text, tmp_path, capsys):
    out = tmp_path / "q"
    assert _quantize(model, out, text, "--max-kl", "0") == 1
    err = capsys.readouterr().err
    assert "KL" in err and "over the budget of 0 (--max-kl)" in err and "nothing written" in err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_force_writes_over_budget(model, text, tmp_path, capsys):
    out = tmp_path / "q"
    assert _quantize(model, out, text, "--max-kl", "0", "--force") == 0
    summary = json.loads((out / "quantize_summary.json").read_text())
    assert summary["forced"] and not summary["passed"] and "--max-kl" in summary["failures"][0]
    assert "despite" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--method", "int8", "--group-size", "64"], "--group-size: int8 has one scale per output channel"),
    (["--max-kl", "-1"], "--max-kl must be >= 0"),
])
def test_bad_options_are_clear_errors(model, text, tmp_path, capsys, extra, message):
    code = main(["quantize", str(model), "--method", "rtn4", "--output", str(tmp_path / "q"), "--eval-text", text,
                 *extra])
    assert code == 2 and message in capsys.readouterr().err


def test_existing_output_is_refused(model, text, tmp_path, capsys):
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "keep.txt").write_text("x")
    assert _quantize(model, tmp_path / "q", text) == 2
    assert "exists and is not an empty directory" in capsys.readouterr().err


def test_eval_alone_and_against_a_baseline(model, text, tmp_path, capsys):
    out = tmp_path / "q"
    assert _quantize(model, out, text, "--max-kl", "100", "--max-ppl-increase", "1000") == 0
    capsys.readouterr()
    result = tmp_path / "eval.json"
    assert main(["eval", str(out), "--baseline", str(model), "--eval-text", text, "--window", "64",
                 "--json", str(result)]) == 0
    assert "KL (nats/token)" in capsys.readouterr().out
    saved = json.loads(result.read_text())
    assert saved["kl"] > 0 and saved["baseline_perplexity"] > 1
    assert main(["eval", str(model), "--eval-text", text, "--window", "64"]) == 0
    assert "perplexity" in capsys.readouterr().out


def test_default_eval_text_ships_with_the_package():
    texts = read_eval_texts(DEFAULT_EVAL_TEXT)
    assert len(texts) == 3 and sum(map(len, texts)) > 20_000

"""The gate's code-completion metric: cases cut at natural token boundaries, the held-out functions disjoint from
the calibration and perplexity texts, the engine's greedy lines scored, the budget refusing a checkpoint."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from lamina import DEMO_MODEL
from lamina.loader.tokenizer import Tokenizer
from lamina.quantize import cli
from lamina.quantize.code_completion import (DEFAULT_FUNCTIONS, CodeResult, CompletionCase, completion_cases,
                                             evaluate_code, function_cases, read_functions, score)
from lamina.quantize.gate import budgets, over_budget, table

DATA = Path(DEFAULT_FUNCTIONS).parent
FUNC = 'def area(w, h):\n    """Area."""\n    if w < 0:\n        raise ValueError("w")\n\n    return w * h'


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(DEMO_MODEL)


def test_cases_are_token_prefixes_cut_before_each_body_line(tokenizer):
    ids = tokenizer.encode(FUNC, add_special_tokens=False)
    cases = function_cases(0, FUNC, tokenizer)
    assert len(cases) == 3  # three body lines: the docstring and the blank line are not cases
    lines = ["    if w < 0:", '        raise ValueError("w")', "    return w * h"]
    for case, line in zip(cases, lines):
        assert case.prompt_token_ids == ids[:len(case.prompt_token_ids)]
        prompt = tokenizer.decode(case.prompt_token_ids)
        assert prompt.endswith(line[:len(line) - len(case.target)]) and line.endswith(case.target)
        assert case.target.strip() == line.strip() and (prompt + case.target) in FUNC


def test_default_functions_are_held_out(tokenizer):
    rows = [json.loads(line) for line in (DATA / "heldout_functions.jsonl").read_text().splitlines()]
    held_out = (Path(__file__).parents[2] / "scripts" / "demo_model" / "heldout_files.txt").read_text().split()
    assert rows and all(r["source"].replace("Lib/", "stdlib/") in held_out for r in rows)
    other = "".join((DATA / name).read_text() for name in ("calib_python.jsonl", "heldout_python.jsonl"))
    assert not any(json.dumps(r["text"])[1:-1] in other for r in rows)  # no function of the other two texts
    cases = completion_cases(read_functions(DEFAULT_FUNCTIONS), tokenizer)
    assert len(cases) > 800
    picked = completion_cases(read_functions(DEFAULT_FUNCTIONS), tokenizer, 128)
    assert len(picked) == 128 and len({c.function for c in picked}) > 60  # spread over the functions


def test_score():
    cases = [CompletionCase(0, [1], t) for t in ("a", "b", "c", "d")]
    result = score(["a", "x", "c", "y"], cases, ["a", "b", "z", "y"])
    assert (result.exact_match, result.baseline_exact_match, result.agreement) == (0.5, 0.5, 0.5)
    assert result.em_drop == 0 and score(["x"] * 4, cases, ["a", "b", "c", "d"]).em_drop == 100


def test_the_engine_completes_lines_and_a_model_agrees_with_itself():
    texts = read_functions(DEFAULT_FUNCTIONS)
    result = evaluate_code(DEMO_MODEL, DEMO_MODEL, texts, max_cases=6)
    assert result.cases == 6 and result.agreement == 1.0 and result.em_drop == 0
    assert result.exact_match == result.baseline_exact_match


def test_budget_and_table():
    code = CodeResult(128, exact_match=0.05, baseline_exact_match=0.10, agreement=0.6)
    from lamina.quantize.evaluate import EvalResult

    result = EvalResult(7.5, 100, 0.05, 0.9, 7.3)
    failures = over_budget(result, 0.05, 0.1, code, 4.0)
    assert len(failures) == 1 and "5.00 points" in failures[0] and "--max-em-drop" in failures[0]
    assert over_budget(result, 0.05, 0.1, code, 5.0) == []
    text = table(result, "rtn4", {"ppl": 0.05, "kl": 0.1, "em": 5.0}, code=code)
    assert "code exact match  10.00 %" in text and "-5.00 pt" in text and "128 code lines" in text
    args = argparse.Namespace(max_ppl_increase=None, max_kl=None, max_em_drop=None)
    from lamina.quant.recipe import get_recipe

    assert budgets(args, get_recipe("int8"))["em"] == 2.0 and budgets(args, get_recipe("rtn4"))["em"] == 5.0
    with pytest.raises(ValueError, match="--max-em-drop must be >= 0"):
        budgets(argparse.Namespace(max_ppl_increase=None, max_kl=None, max_em_drop=-1), get_recipe("rtn4"))


def test_the_cli_refuses_a_checkpoint_over_the_code_budget(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "code_eval", lambda args, model, base: CodeResult(4, 0.0, 0.5, 0.5))
    out = tmp_path / "out"
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["quantize", DEMO_MODEL, "--method", "int8", "--output", str(out),
                              "--max-eval-tokens", "64", "--no-progress"])
    assert args.func(args) == cli.GATE_FAILED
    assert not out.exists() and "--max-em-drop" in capsys.readouterr().err

"""The speculative-decoding bench on a tiny model: a batch-1 row per prompt set and temperature, a throughput
row per batch size and a closed-loop row per concurrency, for the engine without drafts and for each method
asked."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lamina.bench.spec import PROMPT_SETS, TEMPERATURES, held_plain, main, spec_config, turns
from lamina.config import DEFAULT_SPEC_TOKENS
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer


def tiny_bench_model(tmp_path: Path) -> Path:
    """A tiny llama with a tokenizer, for the bench's prompts."""
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    save_tiny_tokenizer(model, vocab_size=300)
    return model


def run_bench(model: Path, tmp_path: Path, *args: str) -> dict:
    """The bench's JSON report of one run over `model` with `args`."""
    result = tmp_path / "spec.json"
    assert main(["--model", str(model), *args, "--disable-tqdm", "--result-file", str(result)]) == 0
    return json.loads(result.read_text())


def test_spec_bench_writes_rows_for_every_engine(tmp_path, capsys):
    results = run_bench(tiny_bench_model(tmp_path), tmp_path, "--new-tokens", "6", "--batch-sizes", "1,3",
                        "--concurrency", "2", "--repeats", "2")["results"]
    assert list(results) == ["off", "ngram"]
    for label, result in results.items():
        rows = result["batch_one"]
        assert [(r["prompts"], r["temperature"]) for r in rows] == [(p, t) for p in PROMPT_SETS for t in TEMPERATURES]
        assert [r["batch_size"] for r in result["throughput"]] == [1, 3]
        assert [r["concurrency"] for r in result["concurrency"]] == [2]
        for row in rows + result["throughput"] + result["concurrency"]:
            assert row["tok_s"] > 0 and 0 <= row["acceptance_rate"] <= 1
            assert row["tokens_per_verify_step"] == 0 or 1 <= row["tokens_per_verify_step"] <= 1 + NGRAM_K
            assert label == "ngram" or row["tokens_per_verify_step"] == 0
            assert len(row["tok_s_repeats"]) == 2 and row["tok_s"] in row["tok_s_repeats"]
            assert len(row["stalls_repeats"]) == 2 and row["stall_steps"] >= 0 and row["gc_ms"] >= 0
            assert len(row["step_ms_median_repeats"]) == 2 and row["step_ms_median"].keys() == row["step_ms"].keys()
            assert all(ms > 0 for ms in row["step_ms_median"].values())
            assert all(r["slowest_step_ms"] > 0 for r in row["stalls_repeats"])
            assert row["draft_ms"] >= 0 and (label == "ngram" or row["draft_ms"] == 0)
            assert label == "ngram" or row["plain_steps"] == 0
    out = capsys.readouterr().out
    assert "speed-up (paired)" in out and "closed loop" in out and "repeats:" in out and "a plain step" in out


NGRAM_K = DEFAULT_SPEC_TOKENS["ngram"]


def test_spec_bench_runs_the_prompt_sets_asked(tmp_path):
    """Only the rows asked; `control` is a second engine without speculation (the paired ratios' noise floor)."""
    model = tiny_bench_model(tmp_path)
    report = run_bench(model, tmp_path, "--new-tokens", "4", "--batch-sizes", "2", "--concurrency", "", "--repeats",
                       "1", "--prompt-sets", "", "--methods", "ngram,control")
    results = report["results"]
    assert list(results) == ["off", "ngram", "control"] and report["speculative_configs"]["control"] is None
    assert all(not r["batch_one"] and [t["batch_size"] for t in r["throughput"]] == [2] and not r["concurrency"]
               for r in results.values())
    rows = run_bench(model, tmp_path, "--new-tokens", "4", "--batch-sizes", "", "--concurrency", "", "--repeats", "1",
                     "--prompt-sets", "chat")["results"]["off"]["batch_one"]
    assert [(r["prompts"], r["temperature"]) for r in rows] == [("chat", t) for t in TEMPERATURES]


def test_a_plain_label_holds_its_engine_in_plain_windows(tmp_path):
    """METHOD-plain: the method's own config, its engine's gate held in plain windows (SpecGate.hold): it verifies
    no draft, and every step is a plain window's."""
    assert spec_config("ngram-plain@5") == {"method": "ngram", "num_speculative_tokens": 5}
    assert held_plain("ngram-plain@5") and held_plain("ngram-plain+guess") and not held_plain("ngram-fixed")
    report = run_bench(tiny_bench_model(tmp_path), tmp_path, "--new-tokens", "12", "--batch-sizes", "",
                       "--concurrency", "", "--repeats", "1", "--prompt-sets", "code", "--methods", "ngram-plain")
    assert report["speculative_configs"]["ngram-plain"] == {"method": "ngram"}
    for row in report["results"]["ngram-plain"]["batch_one"]:
        assert row["acceptance_rate"] == 0 and "verify" not in row["steps"]
        assert row["plain_steps"] == sum(row["steps"].values())


@pytest.mark.parametrize("flag", [["--methods", "ngram,magic"], ["--methods", "ngram-plain-fixed"],
                                  ["--prompt-sets", "code,poetry"]])
def test_spec_bench_rejects_an_unknown_name(flag, capsys):
    with pytest.raises(SystemExit):
        main([*flag, "--disable-tqdm"])
    assert flag[0] in capsys.readouterr().err


def test_each_repeat_starts_with_the_next_engine():
    """No engine always runs first, or right after the same one (a host that slows after one engine's turn)."""
    assert [turns(["off", "ngram", "draft"], r) for r in range(4)] == [
        ["off", "ngram", "draft"], ["ngram", "draft", "off"], ["draft", "off", "ngram"], ["off", "ngram", "draft"]]

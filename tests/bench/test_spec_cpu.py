"""The speculative-decoding CPU bench on a tiny model: a row per prompt set and temperature, counters that add up."""
from __future__ import annotations

import json

from lamina.bench.spec_cpu import PROMPT_SETS, TEMPERATURES, main
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer


def test_spec_bench_writes_a_row_per_prompt_set_and_temperature(tmp_path, capsys):
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    save_tiny_tokenizer(model, vocab_size=300)
    result = tmp_path / "spec.json"
    assert main(["--model", str(model), "--new-tokens", "6", "--disable-tqdm", "--result-file", str(result)]) == 0
    rows = json.loads(result.read_text())["rows"]
    assert [(r["prompts"], r["temperature"]) for r in rows] == [(p, t) for p in PROMPT_SETS for t in TEMPERATURES]
    for row in rows:
        assert row["off_tok_s"] > 0 and row["ngram_tok_s"] > 0 and 0 <= row["acceptance_rate"] <= 1
        assert row["tokens_per_verify_step"] == 0 or 1 <= row["tokens_per_verify_step"] <= 4
    assert "speed-up" in capsys.readouterr().out

"""The speculative-decoding bench on a tiny model: a batch-1 row per prompt set and temperature and a throughput
row per batch size, for the engine without drafts and for each method asked."""
from __future__ import annotations

import json

import pytest

from lamina.bench.spec import PROMPT_SETS, TEMPERATURES, main
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer


def test_spec_bench_writes_rows_for_every_engine(tmp_path, capsys):
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    save_tiny_tokenizer(model, vocab_size=300)
    result = tmp_path / "spec.json"
    assert main(["--model", str(model), "--new-tokens", "6", "--batch-sizes", "1,3", "--repeats", "2",
                 "--disable-tqdm", "--result-file", str(result)]) == 0
    results = json.loads(result.read_text())["results"]
    assert list(results) == ["off", "ngram"]
    for label, result in results.items():
        rows = result["batch_one"]
        assert [(r["prompts"], r["temperature"]) for r in rows] == [(p, t) for p in PROMPT_SETS for t in TEMPERATURES]
        assert [r["batch_size"] for r in result["throughput"]] == [1, 3]
        for row in rows + result["throughput"]:
            assert row["tok_s"] > 0 and 0 <= row["acceptance_rate"] <= 1
            assert row["tokens_per_verify_step"] == 0 or 1 <= row["tokens_per_verify_step"] <= 4
            assert label == "ngram" or row["tokens_per_verify_step"] == 0
            assert len(row["tok_s_repeats"]) == 2 and row["tok_s"] in row["tok_s_repeats"]
    assert "speed-up" in capsys.readouterr().out


def test_spec_bench_rejects_an_unknown_method(tmp_path):
    with pytest.raises(SystemExit):
        main(["--methods", "ngram,magic", "--disable-tqdm"])

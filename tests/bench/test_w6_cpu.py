"""W6 on a tiny model: the table, and a progress bar that counts every generated token as it goes."""
from __future__ import annotations

import json

from lamina.bench.w6_cpu import main, total_tokens
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer


def test_w6_shows_progress_and_writes_json(tmp_path, capsys):
    model = make_tiny_model("llama", tmp_path / "m", vocab_size=320)
    save_tiny_tokenizer(model, vocab_size=300)
    result = tmp_path / "w6.json"
    assert main(["--model", str(model), "--new-tokens", "3", "--repeats", "1", "--result-file", str(result)]) == 0
    captured = capsys.readouterr()
    total = total_tokens(3, 1)
    assert total == 2 * (2 * 8 + 17 * 3)
    assert "W6 HF, batch 1" in captured.err  # the bar names what runs now (HF decoding took minutes, silently)
    assert f"{total}/{total}" in captured.err
    assert "speedup" in captured.out
    assert [row["batch"] for row in json.loads(result.read_text())["rows"]] == [1, 16]

"""`lamina bench serve` as the README writes it, against a real `lamina serve` whose vocabulary (320 ids) and
context (128 tokens) are both smaller than the benchmark's defaults (ids < 10000, 1024 + 128 tokens)."""
from __future__ import annotations

import json

import pytest

from tests.bench.test_cli import _main
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer
from tests.server.harness import RunningServer, make_engine, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    model = make_tiny_model("llama", tmp_path_factory.mktemp("bench-served"), vocab_size=320)
    save_tiny_tokenizer(model, vocab_size=300)
    running = start_server(make_engine(str(model), max_model_len=128))
    yield running
    running.stop()


def test_readme_command_fits_prompts_to_the_served_model(server: RunningServer, tmp_path, capsys) -> None:
    result = tmp_path / "r.json"
    rc = _main(["bench", "serve", "--base-url", server.url, "--request-rate", "inf", "--num-prompts", "4",
                "--disable-tqdm", "--save-detailed", "--result-file", str(result)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    data = json.loads(result.read_text())
    assert data["server_limits"] == {"max_model_len": 128, "vocab_size": 320}
    assert data["dataset"]["vocab_size"] == 320  # ids drawn from the served vocabulary
    [point] = data["points"]
    assert point["completed"] == 4 and point["failed"] == 0
    assert all(r["prompt_len"] == 64 and r["expected_output_len"] == 64 for r in point["requests"])
    assert "4 of 4 requests shortened to fit the server's max_model_len 128" in captured.err


def test_a_rejected_warm_up_names_the_servers_reason(server: RunningServer) -> None:
    with pytest.raises(ValueError) as info:
        _main(["bench", "serve", "--base-url", server.url, "--num-prompts", "2", "--random-vocab-size", "320",
               "--extra-body", '{"max_tokens": 1000}', "--disable-tqdm"])
    message = str(info.value)
    assert "HTTP 400: max_tokens: this model's maximum context length is 128 tokens" in message
    assert "rejected the request" in message and "--base-url" not in message


def test_an_explicit_vocab_size_beyond_the_model_is_refused(server: RunningServer) -> None:
    with pytest.raises(ValueError, match=r"--random-vocab-size 10000 is larger than the served model's vocabulary"):
        _main(["bench", "serve", "--base-url", server.url, "--random-vocab-size", "10000", "--disable-tqdm"])

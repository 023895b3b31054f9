"""The `lamina` command on a tiny model: streaming generate, JSONL batches, logprobs, chat, flags, errors."""
from __future__ import annotations

import io
import json
import math
import subprocess
import sys

import pytest

from lamina import LLM, SamplingParams, __version__
from lamina.cli import build_parser, main
from tests.helpers.tiny_models import make_tiny_model
from tests.helpers.tiny_tokenizer import save_tiny_tokenizer

ENGINE = ["--num-kv-blocks", "128", "--block-size", "4", "--max-model-len", "128"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = make_tiny_model("qwen3", tmp_path_factory.mktemp("cli"), vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return str(path)


def expected_text(model_dir: str, prompts: list[str], max_tokens: int) -> list[str]:
    llm = LLM(model=model_dir, num_kv_blocks=128, block_size=4, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]


def test_generate_streams_the_same_text_as_the_api(model_dir, capsys):
    rc = main(["generate", "def add(a, b):", "--model", model_dir, "--max-tokens", "12", "--temperature", "0",
               "--ignore-eos", *ENGINE])
    assert rc == 0
    assert capsys.readouterr().out == expected_text(model_dir, ["def add(a, b):"], 12)[0] + "\n"


def test_generate_with_speculative_config_streams_the_same_greedy_text(model_dir, capsys):
    prompt = "a = [1, 2, 3, 1, 2, 3, 1, 2"
    rc = main(["generate", prompt, "--model", model_dir, "--max-tokens", "24", "--temperature", "0", "--ignore-eos",
               "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}', *ENGINE])
    assert rc == 0
    assert capsys.readouterr().out == expected_text(model_dir, [prompt], 24)[0] + "\n"
    assert main(["generate", "x", "--model", model_dir, "--speculative-config", '{"method": "medusa"}', *ENGINE]) == 2
    assert "method" in capsys.readouterr().err


def test_generate_batch_jsonl_in_input_order(model_dir, tmp_path):
    prompts = ["class Point:", "for i in range(10):", "日本語"]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps({"prompt": p, "id": i}) for i, p in enumerate(prompts)) + "\n")
    dst = tmp_path / "out.jsonl"
    rc = main(["generate", "--input", str(src), "--output", str(dst), "--model", model_dir, "--max-tokens", "6",
               "--temperature", "0", "--ignore-eos", *ENGINE])
    assert rc == 0
    rows = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert [r["text"] for r in rows] == expected_text(model_dir, prompts, 6)
    assert all(r["finish_reason"] == "length" and len(r["token_ids"]) == 6 for r in rows)


def test_bad_input_gives_a_clear_error_and_exit_code_2(model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json}\n')
    assert main(["generate", "--input", str(bad), "--model", model_dir, *ENGINE]) == 2
    assert "line 2" in capsys.readouterr().err
    assert main(["generate", "x", "--model", model_dir, "--temperature", "-1", *ENGINE]) == 2
    assert "temperature" in capsys.readouterr().err
    assert main(["generate", "x", "--model", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_chat_reads_stdin_through_the_console_script(model_dir):
    proc = subprocess.run([sys.executable, "-m", "lamina.cli", "chat", "--model", model_dir, "--max-tokens", "5",
                           "--temperature", "0", *ENGINE], input="hello\nhow are you\n", capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) >= 2


def offline_logprobs(model_dir: str, prompt: str, max_tokens: int, top: int) -> list[dict]:
    llm = LLM(model=model_dir, num_kv_blocks=128, block_size=4, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=top)
    out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    return list(out.logprobs)


def test_generate_logprobs_in_the_jsonl_and_on_the_terminal(model_dir, tmp_path, capsys):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n")
    common = ["--model", model_dir, "--max-tokens", "5", "--temperature", "0", "--ignore-eos", "--logprobs", "2",
              *ENGINE]
    assert main(["generate", "--input", str(src), "--output", str(dst), *common]) == 0
    [row] = [json.loads(line) for line in dst.read_text().splitlines()]
    expected = offline_logprobs(model_dir, "def add(a, b):", 5, 2)
    assert len(row["logprobs"]) == 5
    for token_id, entry, want in zip(row["token_ids"], row["logprobs"], expected):
        assert entry["token_id"] == token_id and math.isclose(entry["logprob"], want[token_id].logprob)
        assert isinstance(entry["token"], str) and len(entry["top_logprobs"]) == 2
        assert [t["logprob"] for t in entry["top_logprobs"]] == sorted((t["logprob"] for t in entry["top_logprobs"]),
                                                                       reverse=True)
    capsys.readouterr()
    assert main(["generate", "def add(a, b):", *common]) == 0
    captured = capsys.readouterr()
    assert captured.out == row["text"] + "\n"  # stdout stays the text; the table goes to stderr
    table = captured.err.strip().splitlines()
    assert table[0].split() == ["#", "token", "logprob", "top", "2"] and len(table) == 1 + 5
    assert f"{row['logprobs'][0]['logprob']:.3f}" in table[1]


class _Writes(io.StringIO):
    """stdout that records each write (streaming shows as several writes per reply)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_chat_streams_and_drops_the_oldest_turns_when_the_context_is_full(model_dir, monkeypatch, capsys):
    lines = [f"question number {i}: what does this function return" for i in range(6)]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    out = _Writes()
    monkeypatch.setattr(sys, "stdout", out)
    rc = main(["chat", "--model", model_dir, "--system", "be brief", "--max-tokens", "8", "--temperature", "0",
               "--ignore-eos", "--num-kv-blocks", "128", "--block-size", "4", "--max-model-len", "64"])
    assert rc == 0  # it used to exit with 2 ("prompt: ... tokens leave no room for output") after a few turns
    assert out.getvalue().count("\n") == len(lines)  # every line answered
    assert sum(1 for w in out.writes if w.strip()) > len(lines)  # replies arrive token by token
    assert "dropped the oldest" in capsys.readouterr().err


def test_version_and_log_level_before_or_after_the_subcommand(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"lamina {__version__}"
    parser = build_parser()
    assert parser.parse_args(["--log-level", "error", "generate", "x"]).log_level == "ERROR"
    assert parser.parse_args(["generate", "x", "--log-level", "debug"]).log_level == "DEBUG"
    assert parser.parse_args(["bench", "serve", "--log-level", "info"]).log_level == "INFO"
    assert parser.parse_args(["serve", "--log-level", "warning"]).log_level == "WARNING"
    assert parser.parse_args(["generate", "x"]).log_level is None  # main picks: INFO for serve, else WARNING
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "x", "--log-level", "loud"])
    assert "--log-level: must be one of" in capsys.readouterr().err

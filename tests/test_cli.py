"""The `lamina` command on a tiny model: streaming generate, JSONL batches, chat, clear errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lamina import LLM, SamplingParams
from lamina.cli import main
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

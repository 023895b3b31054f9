"""The shipped demo pair (lamina/assets/demo-model, demo-draft): files, sizes, tokenizer, chat template, HF load."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

ASSETS = Path(__file__).resolve().parents[2] / "lamina" / "assets"
TEACHER, DRAFT = ASSETS / "demo-model", ASSETS / "demo-draft"
FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "README.md")


def _params(model_dir: Path) -> int:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())


def _prod(shape: list[int]) -> int:
    out = 1
    for dim in shape:
        out *= dim
    return out


@pytest.mark.parametrize("model_dir", [TEACHER, DRAFT], ids=["teacher", "draft"])
def test_checkpoint_files_and_config(model_dir: Path) -> None:
    for name in FILES:
        assert (model_dir / name).is_file(), f"{model_dir.name} lacks {name}"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "bfloat16"
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # grouped-query attention
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}


def test_sizes() -> None:
    assert 15e6 <= _params(TEACHER) <= 30e6
    assert 2e6 <= _params(DRAFT) <= 5e6
    total = sum(p.stat().st_size for d in (TEACHER, DRAFT) for p in d.iterdir())
    assert total < 50 * 2**20


def test_tokenizer_round_trip_and_special_tokens() -> None:
    assert (TEACHER / "tokenizer.json").read_bytes() == (DRAFT / "tokenizer.json").read_bytes()
    tok = Tokenizer.from_file(str(TEACHER / "tokenizer.json"))
    assert 8000 <= tok.get_vocab_size() <= 16384
    text = 'def grüße(n: int) -> str:\n    """Ω ≈ 2π — 😀"""\n\treturn f"{n:>4}"  # ок\n'
    assert tok.decode(tok.encode(text).ids) == text
    ids = {name: tok.token_to_id(name) for name in ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>")}
    assert None not in ids.values()
    generation = json.loads((TEACHER / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [ids["<|endoftext|>"], ids["<|end|>"]]


def test_chat_template_renders_with_plain_jinja2() -> None:
    config = json.loads((TEACHER / "tokenizer_config.json").read_text())
    assert config.get("bos_token") is None and config["eos_token"] == "<|endoftext|>"
    template = jinja2.Environment().from_string(config["chat_template"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = template.render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="<|endoftext|>")
    assert text == "<|system|>\nBe brief.<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n"


def test_both_load_in_transformers_and_generate() -> None:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    tok = transformers.AutoTokenizer.from_pretrained(TEACHER)
    ids = torch.tensor([tok.encode("def fibonacci(n):", add_special_tokens=False)])
    for model_dir in (TEACHER, DRAFT):
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
        assert out.shape == (1, ids.shape[1] + 8) or int(out[0, -1]) in (0, 4)


def test_the_eagle_head_files_and_config() -> None:
    """lamina/assets/demo-eagle: an EAGLE-3 head of the demo model, bf16, a few MB (loaded and run by
    tests/spec/test_eagle.py)."""
    head = ASSETS / "demo-eagle"
    for name in ("config.json", "model.safetensors", "README.md"):
        assert (head / name).is_file(), f"demo-eagle lacks {name}"
    config = json.loads((head / "config.json").read_text())
    teacher = json.loads((TEACHER / "config.json").read_text())
    assert config["aux_hidden_state_layers"] == [2, 4, 6]
    assert (config["hidden_size"], config["vocab_size"]) == (teacher["hidden_size"], teacher["vocab_size"])
    with safe_open(str(head / "model.safetensors"), "pt") as f:
        assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}
    assert 1e6 <= _params(head) <= 4e6 and (head / "model.safetensors").stat().st_size < 8 * 2**20

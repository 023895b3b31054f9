"""Chat templates render exactly as HF's apply_chat_template(..., tokenize=False) on the same files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, pre_tokenizers

from lamina.loader.chat_template import render_chat_template, validate_messages
from lamina.loader.tokenizer import Tokenizer

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Indented block tags and a tojson of markup: checks trim_blocks/lstrip_blocks and the non-escaping tojson.
BLOCKY = """{% for m in messages %}
    {% if m.role == 'user' %}
[U] {{ m.content | tojson }} {{ eos_token }}
    {% else %}
[A] {% generation %}{{ m.content }}{% endgeneration %}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}[A] {% endif %}"""

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi <b>there</b> & 日本語 🙂"},
        {"role": "assistant", "content": "  Hello!  "},
        {"role": "user", "content": "Again?"}]
SPECIALS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def model_dir(path: Path, chat_template: object = None, jinja_file: str | None = None) -> str:
    """A model dir with a tiny real tokenizer.json and the given template (config entry and/or .jinja file)."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(["<unk>", *SPECIALS.values(), *"abcdefghijklmnopqrstuvwxyz"])}
    backend = BackendTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIALS}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja_file is not None:
        (path / "chat_template.jinja").write_text(jinja_file)
    return str(path)


@pytest.fixture(scope="module")
def hf_auto() -> type:
    return pytest.importorskip("transformers").AutoTokenizer


@pytest.mark.parametrize("template", [CHATML, LLAMA3, BLOCKY], ids=["chatml", "llama3", "blocks"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_matches_hf(tmp_path: Path, hf_auto: type, template: str, add_generation_prompt: bool) -> None:
    path = model_dir(tmp_path / "m", chat_template=template)
    ours = Tokenizer.from_pretrained(path).apply_chat_template(CHAT, add_generation_prompt=add_generation_prompt)
    hf = hf_auto.from_pretrained(path).apply_chat_template(CHAT, tokenize=False,
                                                          add_generation_prompt=add_generation_prompt)
    assert ours == hf
    assert ("<|begin_of_text|>" in ours) == (template == LLAMA3)


def test_tojson_does_not_escape_markup() -> None:
    text = render_chat_template(BLOCKY, [{"role": "user", "content": "<b>é</b>"}], False, SPECIALS)
    assert '"<b>é</b>"' in text


def test_named_templates_and_jinja_file(tmp_path: Path, hf_auto: type) -> None:
    named = [{"name": "default", "template": CHATML}, {"name": "tool_use", "template": "TOOLS"}]
    path = model_dir(tmp_path / "named", chat_template=named)
    ours = Tokenizer.from_pretrained(path).apply_chat_template(CHAT)
    assert ours == hf_auto.from_pretrained(path).apply_chat_template(CHAT, tokenize=False,
                                                                     add_generation_prompt=True)
    # chat_template.jinja (newer HF) wins over the tokenizer_config entry
    path = model_dir(tmp_path / "file", chat_template="IGNORED", jinja_file=LLAMA3)
    ours = Tokenizer.from_pretrained(path).apply_chat_template(CHAT)
    assert ours == hf_auto.from_pretrained(path).apply_chat_template(CHAT, tokenize=False,
                                                                     add_generation_prompt=True)
    assert ours.startswith("<|begin_of_text|>")


def test_no_template_is_a_clear_error(tmp_path: Path) -> None:
    tok = Tokenizer.from_pretrained(model_dir(tmp_path / "m"))
    assert tok.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(CHAT)
    no_default = Tokenizer.from_pretrained(model_dir(tmp_path / "n", [{"name": "a", "template": "x"}]))
    with pytest.raises(ValueError, match="none named 'default'"):
        no_default.apply_chat_template(CHAT)


@pytest.mark.parametrize("messages, match", [
    ("hello", r"messages must be a list"),
    ([{"role": "user", "content": "a"}, "b"], r"messages\[1\] must be a dict"),
    ([{"content": "a"}], r"messages\[0\]\['role'\] must be a string, got missing"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": None}],
     r"messages\[1\]\['content'\] must be a string, got a NoneType"),
    ([{"role": 3, "content": "a"}], r"messages\[0\]\['role'\] must be a string, got a int"),
])
def test_bad_messages_raise(messages: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        validate_messages(messages)
    with pytest.raises(ValueError, match=match):
        render_chat_template(CHATML, messages)  # type: ignore[arg-type]


def test_template_errors_become_value_errors(tmp_path: Path) -> None:
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ValueError, match="roles must alternate"):
        render_chat_template(LLAMA3, two_users, True, SPECIALS)
    with pytest.raises(ValueError, match="not valid jinja2"):
        render_chat_template("{% for m in messages %}", CHAT)
    bad = Path(model_dir(Path(tmp_path) / "bad"))
    (bad / "tokenizer_config.json").write_text(json.dumps({"chat_template": 42}))
    with pytest.raises(ValueError, match="chat_template must be a string"):
        Tokenizer.from_pretrained(str(bad))


def test_sandbox_blocks_unsafe_access() -> None:
    with pytest.raises(ValueError):
        render_chat_template("{{ messages.__class__.__mro__[1].__subclasses__() }}", CHAT)


def test_in_memory_tokenizer_uses_config_template() -> None:
    backend = BackendTokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tok = Tokenizer(backend, {"chat_template": CHATML})
    assert tok.apply_chat_template(CHAT[1:2]).endswith("<|im_start|>assistant\n")

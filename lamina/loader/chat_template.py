"""Chat templates: render a model's jinja2 chat template exactly as HF transformers does.

Where the template comes from (first found wins):

    <model_dir>/chat_template.jinja        newer HF checkpoints
    tokenizer_config.json "chat_template"  a string, or named templates [{"name", "template"}] / {name: template}

Named templates render "default". The environment mirrors HF's: sandboxed, trim_blocks + lstrip_blocks,
loop controls, a `tojson` that does not HTML-escape, `raise_exception(msg)`, `strftime_now(fmt)` and a no-op
`{% generation %}` block; variables: messages, add_generation_prompt, tools/documents (None) and the named
special tokens (bos_token, eos_token, ...).
"""
from __future__ import annotations

import functools
import json
import os
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHAT_TEMPLATE_FILE = "chat_template.jinja"

# A single template, templates by name, or None when the model has none.
ChatTemplateSource = str | dict[str, str] | None


def read_chat_template(model_dir: str, tokenizer_config: dict) -> ChatTemplateSource:
    """The model's chat template as stored (see the module docstring); None when it has none."""
    path = os.path.join(model_dir, CHAT_TEMPLATE_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    return parse_chat_template(tokenizer_config.get("chat_template"))


def parse_chat_template(raw: object) -> ChatTemplateSource:
    """tokenizer_config.json's chat_template value as a string, a {name: template} dict or None."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                     and isinstance(t.get("template"), str) for t in raw):
        return {t["name"]: t["template"] for t in raw}
    if isinstance(raw, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        return dict(raw)
    raise ValueError("tokenizer_config.json: chat_template must be a string or a list of "
                     f"{{'name': str, 'template': str}} objects, got {type(raw).__name__}")


def select_template(source: ChatTemplateSource) -> str:
    """The template text to render: the string itself, or the template named "default"."""
    if source is None:
        raise ValueError("this model has no chat template (no chat_template in tokenizer_config.json and no "
                         f"{CHAT_TEMPLATE_FILE}): use generate() with a plain prompt instead of chat")
    if isinstance(source, str):
        return source
    if "default" not in source:
        raise ValueError(f"the model has several chat templates {sorted(source)} and none named 'default'")
    return source["default"]


def validate_messages(messages: object) -> None:
    """Raise ValueError unless `messages` is a list of dicts with string 'role' and 'content'."""
    if not isinstance(messages, list):
        raise ValueError(f"messages must be a list of {{'role': str, 'content': str}} dicts, "
                         f"got {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', "
                             f"got {type(message).__name__}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "missing" if key not in message else f"a {type(message[key]).__name__}"
                raise ValueError(f"messages[{i}]['{key}'] must be a string, got {got}")


def render_chat_template(source: ChatTemplateSource, messages: list[dict], add_generation_prompt: bool = True,
                         special_tokens: dict[str, str] | None = None) -> str:
    """Render the chat `messages` with the model's template into prompt text.

    special_tokens maps names like "bos_token" to their strings; the template sees them as variables.
    A template's raise_exception (e.g. "roles must alternate") becomes a ValueError.
    """
    validate_messages(messages)
    template = _compile(select_template(source))
    try:
        return template.render(**(special_tokens or {}), messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt)
    except jinja2.TemplateError as e:
        raise ValueError(f"the chat template rejected these messages: {e}") from e


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker) renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF overrides jinja's tojson, which HTML-escapes '<', '>' and '&' and would corrupt prompts.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"the model's chat template is not valid jinja2 (line {e.lineno}): {e.message}") from e

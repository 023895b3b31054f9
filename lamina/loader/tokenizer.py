"""Tokenizer: `tokenizers.Tokenizer` from a model directory, with HF transformers' special-token rules.

Files read from the model directory:

    tokenizer.json          the fast tokenizer (required): model, pre-tokenizer, decoder, post-processor
    tokenizer_config.json   named special tokens (bos/eos/...), extra added tokens, chat_template
    chat_template.jinja     the chat template as newer HF saves it (wins over tokenizer_config's)
    generation_config.json  eos_token_id (int or list): extra stop tokens; config.json when absent

BOS/EOS insertion is what the tokenizer.json post-processor says, exactly as `AutoTokenizer` (transformers
5.x) does: it drops tokenizer_config's `add_bos_token`/`add_eos_token` whenever a tokenizer.json exists.
"""
from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from lamina.loader.chat_template import (ChatTemplateSource, parse_chat_template, read_chat_template,
                                         render_chat_template)
from lamina.loader.token_bytes import max_bytes_per_token

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                       "mask_token")
_ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")
_GIL_FREE_CHARS = 1 << 14  # longer texts are encoded without holding the GIL


def read_json_file(path: str) -> dict:
    """The JSON object in `path`, {} when the file does not exist; ValueError naming the file if malformed."""
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _token_content(value: object, field: str) -> str | None:
    """A special token as tokenizer_config stores it: a string or an AddedToken dict with "content"."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"{TOKENIZER_CONFIG_FILE}: {field} must be a string or an object with a string "
                     f"'content', got {value!r}")


def _extra_special_tokens(config: dict) -> list[str]:
    """additional_special_tokens (HF 4.x name) and extra_special_tokens (5.x; a list or a name -> token map)."""
    tokens: list[str] = []
    for key in ("additional_special_tokens", "extra_special_tokens"):
        value = config.get(key) or []
        items = list(value.values()) if isinstance(value, dict) else value
        if not isinstance(items, list):
            raise ValueError(f"{TOKENIZER_CONFIG_FILE}: {key} must be a list, got {value!r}")
        tokens += [t for t in (_token_content(v, key) for v in items) if t is not None]
    return tokens


def _model_eos_token_ids(model_dir: str) -> list[int]:
    """eos_token_id of generation_config.json (config.json when there is none): an int, a list or null."""
    name = "generation_config.json"
    if not os.path.isfile(os.path.join(model_dir, name)):
        name = "config.json"
    value = read_json_file(os.path.join(model_dir, name)).get("eos_token_id")
    ids = [value] if isinstance(value, int) else value
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                            for i in ids):
        raise ValueError(f"{name}: eos_token_id must be an integer >= 0 or a list of them, got {value!r}")
    return ids


class Tokenizer:
    """Text <-> token ids for one model, plus its special tokens and chat template.

    Build it with from_pretrained(model_dir). The constructor takes an in-memory backend and the
    tokenizer_config dict (its chat_template is used unless `chat_template` is given).
    """

    def __init__(self, backend: BackendTokenizer, config: dict, model_eos_token_ids: Sequence[int] = (),
                 chat_template: ChatTemplateSource = None) -> None:
        self._backend = backend
        # An engine must never cut a prompt silently (tokenizer.json may carry truncation/padding settings).
        self._backend.no_truncation()
        self._backend.no_padding()
        self._special_tokens = {key: tok for key in _SPECIAL_TOKEN_KEYS
                                if (tok := _token_content(config.get(key), key)) is not None}
        self._register_added_tokens(config)
        self._model_eos_token_ids = frozenset(model_eos_token_ids)
        self._chat_template = chat_template or parse_chat_template(config.get("chat_template"))

    @classmethod
    def from_pretrained(cls, model_dir: str) -> Tokenizer:
        """Load the tokenizer of the HF-format model directory `model_dir`."""
        if not os.path.isdir(model_dir):
            raise ValueError(f"model directory {model_dir!r} does not exist")
        path = os.path.join(model_dir, TOKENIZER_FILE)
        if not os.path.isfile(path):
            raise ValueError(f"no {TOKENIZER_FILE} in {model_dir!r}: lamina needs a fast-tokenizer file to turn "
                             f"text into tokens; without one, load the model with skip_tokenizer_init=True "
                             f"and pass prompts as token ids")
        try:
            backend = BackendTokenizer.from_file(path)
        except Exception as e:  # the Rust side raises a bare Exception on a malformed file
            raise ValueError(f"cannot read {path}: {e}") from e
        config = read_json_file(os.path.join(model_dir, TOKENIZER_CONFIG_FILE))
        return cls(backend, config, _model_eos_token_ids(model_dir), read_chat_template(model_dir, config))

    def _register_added_tokens(self, config: dict) -> None:
        """Make tokenizer_config's special and added tokens added tokens of the backend, as HF does.

        A token already in the base vocabulary keeps its id but becomes an added (atomic, skippable) token;
        an unknown one gets the next free id.
        """
        present = {tok.content for tok in self._backend.get_added_tokens_decoder().values()}
        decoder = config.get("added_tokens_decoder") or {}
        for _, spec in sorted(decoder.items(), key=lambda item: int(item[0])):
            content = _token_content(spec, "added_tokens_decoder")
            if content is not None and content not in present:
                flags = {k: bool(spec[k]) for k in _ADDED_TOKEN_FLAGS if isinstance(spec, dict) and k in spec}
                self._backend.add_tokens([AddedToken(content, **flags)])
                present.add(content)
        named = [*self._special_tokens.values(), *_extra_special_tokens(config)]
        missing = [t for t in dict.fromkeys(named) if t not in present]
        if missing:
            self._backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])

    # -- text <-> ids ---------------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; add_special_tokens applies the post-processor (e.g. a leading BOS)."""
        if not isinstance(text, str):
            raise ValueError(f"text to encode must be a string, got {type(text).__name__}")
        if len(text) > _GIL_FREE_CHARS:  # encode_batch releases the GIL (encode does not): other threads run
            return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    @functools.cached_property
    def max_bytes_per_token(self) -> int | None:
        """The most UTF-8 bytes of text one token covers; None when the tokenizer may shrink its input (see
        lamina.loader.token_bytes). Computed once, from the whole vocabulary."""
        return max_bytes_per_token(self._backend)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`. Ids unknown to the tokenizer (a padded LM head) decode to nothing."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | None | list[str | None]:
        """Vocabulary strings of `ids` (None for an unknown id); an int gives one string."""
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        return [self._backend.id_to_token(i) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        """Id of the vocabulary string `token`, None when it is not in the vocabulary."""
        return self._backend.token_to_id(token)

    # -- vocabulary and special tokens ----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of tokens including added tokens (HF's len(tokenizer))."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> str | None:
        return self._special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self._special_tokens.get("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        """tokenizer_config's eos token; see eos_token_ids for everything the engine stops on."""
        return self._special_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._special_id("pad_token")

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every end-of-sequence id: tokenizer_config's eos_token plus generation_config's eos_token_id."""
        eos = self.eos_token_id
        return self._model_eos_token_ids | ({eos} if eos is not None else set())

    @property
    def all_special_ids(self) -> list[int]:
        """Sorted ids of all special tokens: the ones decode(skip_special_tokens=True) drops."""
        added = self._backend.get_added_tokens_decoder()
        ids = {i for i, tok in added.items() if tok.special}
        ids |= {i for key in self._special_tokens if (i := self._special_id(key)) is not None}
        return sorted(ids)

    def _special_id(self, key: str) -> int | None:
        token = self._special_tokens.get(key)
        return None if token is None else self._backend.token_to_id(token)

    # -- chat -----------------------------------------------------------------------------------------------

    @property
    def chat_template(self) -> ChatTemplateSource:
        """The raw template: a string, named templates, or None when the model has none."""
        return self._chat_template

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat rendered as prompt text.

        Tokenize it with add_special_tokens=False, as HF does: the template already holds any BOS.
        """
        return render_chat_template(self._chat_template, messages, add_generation_prompt,
                                    special_tokens=dict(self._special_tokens))

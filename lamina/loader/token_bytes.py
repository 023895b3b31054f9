"""How much input text one token can cover: a cheap bound on a prompt's token count before tokenizing it.

For a tokenizer that never shrinks its input (byte-level BPE as in GPT-2 / Llama 3 / Qwen, or a sentencepiece
style BPE that only replaces spaces with the longer "▁"), every byte of the prompt's UTF-8 is covered by one
token, and one token covers at most `max_bytes_per_token` bytes. So a prompt of B bytes has at least
ceil(B / max_bytes_per_token) tokens: a server can refuse a prompt far longer than its context at once,
without spending seconds tokenizing it.

A pipeline that can drop or merge text (a unicode normalizer, a whitespace-splitting pre-tokenizer, WordPiece's
[UNK] for a whole word) gives no such bound: `max_bytes_per_token` is None there.
"""
from __future__ import annotations

import json

from tokenizers import Tokenizer as BackendTokenizer

# Pre-tokenizers that keep every input character (Split and Punctuation unless their behavior is "removed").
_KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation",
                                     "UnicodeScripts"})
_MIN_BYTES = 4  # an unknown character (one [UNK] token) is at most 4 UTF-8 bytes


def max_bytes_per_token(backend: BackendTokenizer) -> int | None:
    """The most UTF-8 bytes of input one token can cover, or None when the tokenizer may shrink its input."""
    spec = json.loads(backend.to_str())
    if not _keeps_input(spec):
        return None
    byte_level = _is_byte_level(spec.get("pre_tokenizer")) or _is_byte_level(spec.get("decoder"))
    # Byte-level vocabularies spell each byte as one character; elsewhere a token's own UTF-8 is never
    # shorter than the input it covers ("▁" for a space, "<0x0A>" for a byte fallback).
    vocab = backend.get_vocab(with_added_tokens=False)
    longest = max((len(t) if byte_level else utf8_len(t) for t in vocab), default=0)
    added = max((utf8_len(t.content) for t in backend.get_added_tokens_decoder().values()), default=0)
    return max(longest, added, _MIN_BYTES)


def utf8_len(text: str) -> int:
    """Bytes of `text` in UTF-8 (a lone surrogate counts its 3 bytes instead of raising)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _keeps_input(spec: dict) -> bool:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return False
    return _normalizer_keeps(spec.get("normalizer")) and _pre_tokenizer_keeps(spec.get("pre_tokenizer"))


def _normalizer_keeps(node: dict | None) -> bool:
    """No normalizer, or one that only prepends or replaces with something at least as long."""
    if node is None:
        return True
    kind = node.get("type")
    if kind == "Sequence":
        return all(_normalizer_keeps(n) for n in node.get("normalizers", []))
    if kind == "Prepend":
        return True
    if kind == "Replace":
        pattern = node.get("pattern") or {}
        return "String" in pattern and utf8_len(node.get("content", "")) >= utf8_len(pattern["String"])
    return False


def _pre_tokenizer_keeps(node: dict | None) -> bool:
    if node is None:
        return True
    kind = node.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps(n) for n in node.get("pretokenizers", []))
    return kind in _KEEPING_PRE_TOKENIZERS and str(node.get("behavior", "")).lower() != "removed"


def _is_byte_level(node: dict | None) -> bool:
    if node is None:
        return False
    if node.get("type") == "Sequence":
        return any(_is_byte_level(n) for n in node.get("pretokenizers", node.get("decoders", [])))
    return node.get("type") == "ByteLevel"

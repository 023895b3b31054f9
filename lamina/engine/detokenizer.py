"""IncrementalDetokenizer: streaming output text of one request, with stop-string handling.

Token ids are decoded through a small sliding window (vLLM/TGI's prefix/read offsets):

    ids:   | ...... prompt ...... | ......... output ......... |
                     ^ prefix_offset      ^ read_offset        ^ len(ids)
    text(ids[prefix_offset:read_offset]) is already in output_text (or is prompt context);
    new text = text(ids[prefix_offset:]) minus that prefix.

Decoding with a few previous tokens as context keeps the spaces that decoders strip from a sequence's
start (SentencePiece "▁"). While the new text ends with U+FFFD the last token(s) hold part of a multi-byte
UTF-8 character, so nothing is emitted and the offsets stay until the character is complete.

Stop strings are searched only in the newly produced text plus (longest stop - 1) chars before it, so a
stop string spanning two tokens is found. get_delta() holds back that many trailing chars, since they may
still be cut by a stop string, until the request is finished.
"""
from __future__ import annotations

from collections.abc import Sequence

from lamina.loader.tokenizer import Tokenizer

# Prompt tokens kept as decoding context for the first output token (vLLM uses the same 5).
_INITIAL_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Output text of one request, built token by token.

    Attributes read by the engine: `output_text` (all text so far, stop string cut), `finished`,
    `stop_reason` (the matched stop string or None), `num_output_tokens` (tokens taken: those after the
    one that completed a stop string are ignored, so the engine can drop them).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True,
                 stop: Sequence[str] | None = None, include_stop_str_in_output: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = [s for s in (stop or []) if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        self._ids = list(prompt_token_ids)
        self._num_prompt_tokens = len(self._ids)
        self._read_offset = len(self._ids)
        self._prefix_offset = max(self._read_offset - _INITIAL_CONTEXT_TOKENS, 0)
        self._stop_lookback = max((len(s) for s in self.stop), default=1) - 1
        self._num_emitted_chars = 0
        self._token_text_cache: dict[int, str] = {}
        self.output_text = ""
        self.finished = False
        self.stop_reason: str | None = None

    @property
    def output_token_ids(self) -> list[int]:
        """The output tokens taken so far."""
        return self._ids[self._num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self._ids) - self._num_prompt_tokens

    def update(self, new_token_ids: Sequence[int]) -> str | None:
        """Append tokens (one or several, e.g. accepted drafts); return the stop string if one was hit.

        On a hit, output_text is cut at the stop string (kept when include_stop_str_in_output), the
        detokenizer is finished and the tokens after the one that completed it are not taken.
        """
        if self.finished:
            raise RuntimeError("IncrementalDetokenizer.update() called after the request finished")
        for token_id in new_token_ids:
            self._ids.append(token_id)
            start = len(self.output_text)
            self.output_text += self._decode_next(flush=False)
            if self._check_stop(start):
                return self.stop_reason
        return None

    def finish(self) -> str | None:
        """Mark the request finished (eos, length, abort): releases held-back text via get_delta().

        Text still pending (an incomplete UTF-8 character at the very end) is flushed, with U+FFFD as
        decode() would show it; returns a stop string if that flushed text completed one.
        """
        if self.finished:
            return None
        start = len(self.output_text)
        self.output_text += self._decode_next(flush=True)
        self._check_stop(start)
        self.finished = True
        return self.stop_reason

    @property
    def visible_text(self) -> str:
        """output_text without the tail a stop string may still cut (all of it once finished)."""
        if self.finished:
            return self.output_text
        return self.output_text[:max(0, len(self.output_text) - self._stop_lookback)]

    def get_delta(self) -> str:
        """Text added since the last call, for streaming; never text that a stop string may still cut."""
        visible = self.visible_text
        if len(visible) <= self._num_emitted_chars:
            return ""
        delta = visible[self._num_emitted_chars:]
        self._num_emitted_chars = len(visible)
        return delta

    def decode_token(self, token_id: int) -> str:
        """Text of one token on its own (logprobs' decoded_token); special tokens are kept."""
        text = self._token_text_cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text_cache[token_id] = text
        return text

    def _decode_next(self, flush: bool) -> str:
        """New text of the tokens past read_offset; "" while it ends in a partial character (unless flush)."""
        if self._read_offset == len(self._ids):
            return ""
        decode = self.tokenizer.decode
        prefix_text = decode(self._ids[self._prefix_offset:self._read_offset], self.skip_special_tokens)
        new_text = decode(self._ids[self._prefix_offset:], self.skip_special_tokens)
        if not flush and (len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR)):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text):]

    def _check_stop(self, start: int) -> bool:
        """Find the earliest stop string in output_text[start - lookback:]; cut the text there if found."""
        if not self.stop or len(self.output_text) == start:
            return False
        search_from = max(start - self._stop_lookback, 0)
        hits = [(i, s) for s in self.stop if (i := self.output_text.find(s, search_from)) != -1]
        if not hits:
            return False
        index, stop = min(hits, key=lambda hit: (hit[0], -len(hit[1])))
        self.output_text = self.output_text[:index + len(stop) if self.include_stop_str_in_output else index]
        self.stop_reason = stop
        self.finished = True
        return True

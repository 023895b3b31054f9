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

The text is kept as pieces, so that streaming a request costs time linear in its length (a growing str
would be copied whole on every token):

    output_text = "".join(stable) + tail
    stable: pieces no stop string can cut any more (what visible_text shows while running)
    tail:   the last (longest stop - 1) chars, plus the text of the token being taken
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
        self._stable: list[str] = []
        self._tail = ""
        self._num_emitted_pieces = 0  # get_delta(): pieces of _stable already returned
        self._token_text_cache: dict[int, str] = {}
        self.finished = False
        self.stop_reason: str | None = None

    @property
    def output_text(self) -> str:
        """All text so far (stop string cut). Joins every piece: O(length), for whole-text readers."""
        return "".join(self._stable) + self._tail

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
            if self._take(self._decode_next(flush=False)):
                return self.stop_reason
        return None

    def finish(self) -> str | None:
        """Mark the request finished (eos, length, abort): releases held-back text via get_delta().

        Text still pending (an incomplete UTF-8 character at the very end) is flushed, with U+FFFD as
        decode() would show it; returns a stop string if that flushed text completed one.
        """
        if self.finished:
            return None
        self._take(self._decode_next(flush=True))
        self.finished = True
        return self.stop_reason

    @property
    def visible_text(self) -> str:
        """output_text without the tail a stop string may still cut (all of it once finished)."""
        if self.finished:
            return self.output_text
        return "".join(self._stable)

    def get_delta(self, final: bool = False) -> str:
        """Text added since the last call, for streaming; never text that a stop string may still cut,
        unless the detokenizer finished or `final` says the request is over (an abort: nothing follows).
        Costs the length of the delta, not of the text."""
        if self.finished or final:
            self._stabilize(keep=0)
        delta = "".join(self._stable[self._num_emitted_pieces:])
        self._num_emitted_pieces = len(self._stable)
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

    def _take(self, new_text: str) -> bool:
        """Append one token's text, cut it at a stop string if one completed; True on a stop."""
        if not new_text:
            return False
        self._tail += new_text
        if self._check_stop():
            return True
        self._stabilize(keep=self._stop_lookback)
        return False

    def _stabilize(self, keep: int) -> None:
        """Move all but the last `keep` chars of the tail into the stable pieces."""
        cut = len(self._tail) - keep
        if cut > 0:
            self._stable.append(self._tail[:cut])
            self._tail = self._tail[cut:]

    def _check_stop(self) -> bool:
        """Find the earliest stop string in the tail (the new text and the look-back before it); cut
        the text there if found."""
        if not self.stop:
            return False
        hits = [(i, s) for s in self.stop if (i := self._tail.find(s)) != -1]
        if not hits:
            return False
        index, stop = min(hits, key=lambda hit: (hit[0], -len(hit[1])))
        self._tail = self._tail[:index + len(stop) if self.include_stop_str_in_output else index]
        self.stop_reason = stop
        self.finished = True
        return True

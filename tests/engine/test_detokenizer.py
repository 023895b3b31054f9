"""IncrementalDetokenizer on real tokenizers whose tokens split multi-byte UTF-8 characters."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from lamina.engine.detokenizer import IncrementalDetokenizer
from lamina.loader.tokenizer import Tokenizer

CORPUS = ["the quick brown fox jumps over the lazy dog. hello world, hello there!"] * 30 + [
    "héllo wörld 日本語 emoji 🙂 café naïve 中文 ✓"]
TEXT = "héllo wörld! 日本語 and emoji 🙂🙂 then the quick brown fox said ✓ café 中文 STOP here. ß done"
PROMPT = "the lazy dog said 日"


def byte_level_tokenizer() -> Tokenizer:
    """GPT-2-style byte-level BPE with a tiny vocab: multi-byte chars span several tokens."""
    tok = BackendTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return Tokenizer(tok, {"eos_token": "<|endoftext|>"})


def sentencepiece_tokenizer() -> Tokenizer:
    """Llama-2-style: Metaspace, byte fallback <0xNN> for non-ASCII, a decoder that strips the first space."""
    trained = BackendTokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, show_progress=False))
    model = json.loads(trained.to_str())["model"]
    keep = [t for t in model["vocab"] if t.replace("▁", "").isascii()]
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *keep])}
    merges = [(a, b) for a, b in model["merges"] if a in vocab and b in vocab and a + b in vocab]
    tok = BackendTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return Tokenizer(tok, {"bos_token": "<s>", "eos_token": "</s>"})


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def tok(request: pytest.FixtureRequest) -> Tokenizer:
    return byte_level_tokenizer() if request.param == "byte_level" else sentencepiece_tokenizer()


def expected_text(tok: Tokenizer, prompt_ids: list[int], out_ids: list[int]) -> str:
    """Output text in context: what decoding prompt + output adds to the decoded prompt."""
    return tok.decode(prompt_ids + out_ids)[len(tok.decode(prompt_ids)):]


def stream(detok: IncrementalDetokenizer, ids: list[int], chunk: int = 1) -> list[str]:
    """Feed ids `chunk` at a time, collecting every delta (the final one after finish())."""
    deltas = []
    for i in range(0, len(ids), chunk):
        if detok.update(ids[i:i + chunk]) is not None:
            break
        deltas.append(detok.get_delta())
    detok.finish()
    deltas.append(detok.get_delta())
    return deltas


def test_tokens_split_multibyte_chars(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert sum("\ufffd" in tok.decode([i]) for i in ids) >= 4


@pytest.mark.parametrize("prompt", ["", PROMPT])
def test_deltas_concatenate_to_full_decode(tok: Tokenizer, prompt: str) -> None:
    prompt_ids = tok.encode(prompt) if prompt else []
    out_ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt_ids, skip_special_tokens=True, stop=[],
                                   include_stop_str_in_output=False)
    deltas = stream(detok, out_ids)
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == detok.output_text == expected_text(tok, prompt_ids, out_ids)
    if not prompt:
        assert detok.output_text == tok.decode(out_ids) == TEXT
    assert detok.output_token_ids == out_ids and detok.stop_reason is None


def test_special_tokens_skipped_or_kept(tok: Tokenizer) -> None:
    out_ids = tok.encode("hello world", add_special_tokens=False) + [tok.eos_token_id]
    for skip in (True, False):
        detok = IncrementalDetokenizer(tok, [], skip_special_tokens=skip)
        assert "".join(stream(detok, out_ids)) == tok.decode(out_ids, skip_special_tokens=skip)
    assert detok.output_text.endswith(tok.eos_token)


def boundary_stop(tok: Tokenizer, ids: list[int], near: str) -> str:
    """A 4-char stop string of TEXT that starts in one token and ends in the next, near `near`."""
    texts = [tok.decode(ids[:k]) for k in range(1, len(ids))]
    ends = [len(t) for t in texts if not t.endswith("\ufffd")]
    cut = next(e for e in ends if e > TEXT.index(near) + 1)
    return TEXT[cut - 2:cut + 2]


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("chunk", [1, 3])
def test_stop_string_spanning_tokens_is_cut(tok: Tokenizer, include: bool, chunk: int) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    stop = boundary_stop(tok, ids, "quick")
    detok = IncrementalDetokenizer(tok, [], stop=["never", stop], include_stop_str_in_output=include)
    deltas, streamed = [], ""
    for i in range(0, len(ids), chunk):
        hit = detok.update(ids[i:i + chunk])
        deltas.append(detok.get_delta())
        streamed += deltas[-1]
        assert detok.output_text.startswith(streamed)  # never streamed text that is cut later
        if hit is not None:
            break
    at = TEXT.index(stop)
    assert hit == detok.stop_reason == stop and detok.finished
    assert detok.output_text == TEXT[:at + len(stop) if include else at]
    assert "".join(deltas) == detok.output_text
    # only the tokens up to the one that completed the stop string are taken
    taken = detok.num_output_tokens
    assert len(tok.decode(ids[:taken])) >= at + len(stop) > len(tok.decode(ids[:taken - 1]))
    with pytest.raises(RuntimeError):
        detok.update(ids[taken:taken + 1])


def test_earliest_stop_wins_and_held_back_text_is_released(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [], stop=["STOP here", "fox"])
    assert stream(detok, ids) and detok.stop_reason == "fox"
    # a long stop string never matched: its look-back is held until finish(), then released
    detok = IncrementalDetokenizer(tok, [], stop=["x" * 12])
    for token_id in ids:
        detok.update([token_id])
    assert detok.get_delta() == TEXT[:-11]
    assert detok.finish() is None and detok.get_delta() == TEXT[-11:]
    assert detok.get_delta() == ""


def test_finish_flushes_an_incomplete_character(tok: Tokenizer) -> None:
    ids = tok.encode("ok 日", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    detok.update(ids[:-1])  # the last byte of 日 is missing
    assert detok.output_text == "ok " and detok.get_delta() == "ok "
    detok.finish()
    assert detok.output_text == tok.decode(ids[:-1]) and detok.output_text.endswith("\ufffd")


def test_decode_token(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, [])
    ids = tok.encode("hello", add_special_tokens=False)
    assert "".join(detok.decode_token(i) for i in ids).strip() == "hello"
    assert detok.decode_token(tok.eos_token_id) == tok.eos_token

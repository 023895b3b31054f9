"""Train the demo tokenizer: byte-level BPE (HF `tokenizers`) on a sample of the training corpus.

Writes OUT/tokenizer.json and OUT/tokenizer_config.json (no BOS token, eos `<|endoftext|>`, a chat
template that plain jinja2 renders). Special tokens take the first ids:

    0 <|endoftext|>   between files; eos
    1 <|system|>  2 <|user|>  3 <|assistant|>  4 <|end|>   chat turns; <|end|> closes a turn (also a stop id)
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
EOS = "<|endoftext|>"
END_OF_TURN = "<|end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def sample_texts(path: Path, max_chars: int) -> Iterator[str]:
    """The first documents of a jsonl corpus (already in content-hash order) up to ``max_chars``."""
    total = 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            total += len(text)
            if total > max_chars:
                return
            yield text


def train_tokenizer(texts: Iterator[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE with GPT-2 pre-tokenization (runs of spaces stay whole: code indentation)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_config(model_max_length: int) -> dict:
    """tokenizer_config.json: what transformers and lamina's loader read."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "chat_template": CHAT_TEMPLATE,
    }


def save(tok: Tokenizer, out: Path, model_max_length: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = tokenizer_config(model_max_length)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def check_round_trip(tok: Tokenizer) -> None:
    """Decoding must give the bytes back, unicode and indentation included."""
    sample = 'def grüße(n: int) -> str:\n    """Ω ≈ 2π — 😀"""\n\treturn f"{n:>4}"  # ok\n'
    ids = tok.encode(sample).ids
    if tok.decode(ids) != sample:
        raise RuntimeError(f"tokenizer round trip failed: {tok.decode(ids)!r}")
    chat = "<|user|>\nhi<|end|>\n"
    if tok.encode(chat).ids[0] != SPECIAL_TOKENS.index("<|user|>"):
        raise RuntimeError("special tokens are not matched in text")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True, help="directory with train.jsonl (corpus.py)")
    parser.add_argument("--out", required=True, help="directory for tokenizer.json + tokenizer_config.json")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--sample-chars", type=int, default=60_000_000, help="training sample size")
    parser.add_argument("--model-max-length", type=int, default=1024)
    args = parser.parse_args()
    tok = train_tokenizer(sample_texts(Path(args.corpus) / "train.jsonl", args.sample_chars), args.vocab_size)
    check_round_trip(tok)
    save(tok, Path(args.out), args.model_max_length)
    print(f"tokenizer: {tok.get_vocab_size()} tokens -> {args.out}")


if __name__ == "__main__":
    main()

"""Tokenize the corpus into a `lamina distill` data directory (meta.json, train.bin, heldout.bin).

Every document is encoded on its own and followed by `<|endoftext|>`; ids are stored as uint16.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from lamina.distill.data import write_token_data


def batches(path: Path, size: int) -> Iterator[list[str]]:
    """The documents of a jsonl file in lists of ``size``."""
    batch: list[str] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            batch.append(json.loads(line)["text"])
            if len(batch) == size:
                yield batch
                batch = []
    if batch:
        yield batch


def encode_file(tok: Tokenizer, path: Path, eos_id: int, batch_size: int = 2048) -> tuple[np.ndarray, int]:
    """All documents of ``path`` as one uint16 stream with eos after each; also returns the char count."""
    parts: list[np.ndarray] = []
    chars = 0
    eos = np.array([eos_id], dtype=np.uint16)
    for texts in batches(path, batch_size):
        chars += sum(len(t) for t in texts)
        for enc in tok.encode_batch_fast(texts, add_special_tokens=False):
            parts += [np.asarray(enc.ids, dtype=np.uint16), eos]
    return (np.concatenate(parts) if parts else np.zeros(0, np.uint16)), chars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", required=True, help="directory with train.jsonl and heldout.jsonl")
    parser.add_argument("--tokenizer", required=True, help="directory with tokenizer.json")
    parser.add_argument("--out", required=True, help="data directory to write")
    args = parser.parse_args()
    tok_path = Path(args.tokenizer) / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_path))
    eos_id = tok.token_to_id("<|endoftext|>")
    start = time.perf_counter()
    train, train_chars = encode_file(tok, Path(args.corpus) / "train.jsonl", eos_id)
    heldout, heldout_chars = encode_file(tok, Path(args.corpus) / "heldout.jsonl", eos_id)
    meta = {
        "tokenizer_sha256": hashlib.sha256(tok_path.read_bytes()).hexdigest(),
        "chars_per_token": round((train_chars + heldout_chars) / max(1, len(train) + len(heldout)), 3),
    }
    write_token_data(args.out, train, heldout, tok.get_vocab_size(), eos_id, meta)
    print(f"tokenized {len(train):,} train + {len(heldout):,} held-out tokens "
          f"({meta['chars_per_token']} chars/token) in {time.perf_counter() - start:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()

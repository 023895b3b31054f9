"""Calibration data for GPTQ and AWQ: text -> token sequences of at most `seq_len` tokens.

    documents --tokenize--> d0 <eos> d1 <eos> d2 ...  --cut--> | seq 0 | seq 1 | ... | seq n-1 | rest |
                                                                 each seq_len tokens; `rest` kept only
                                                                 when no full sequence exists

Sequences are cut from the documents laid end to end (separated by the tokenizer's end-of-text token, as
the demo model was trained), and `num_samples` of them are drawn without replacement with a fixed seed.
The default text (`DEFAULT_CALIB_TEXT`) is CPython standard-library source that does not overlap the
accuracy gate's held-out text (lamina/quantize/data/README.md).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lamina.jsonl import read_jsonl

if TYPE_CHECKING:
    from lamina.loader.tokenizer import Tokenizer

DEFAULT_CALIB_TEXT = str(Path(__file__).parent / "data" / "calib_python.jsonl")
DEFAULT_NUM_SAMPLES = 128
DEFAULT_SEQ_LEN = 512
MIN_TOKENS = 16  # a shorter text calibrates nothing useful


def read_calib_texts(path: str) -> list[str]:
    """The "text" of every line of a .jsonl file; ValueError naming --calib for anything else."""
    file = Path(path)
    if not file.is_file() or file.suffix != ".jsonl":
        raise ValueError(f"--calib: {path!r} is not a .jsonl file of {{\"text\": ...}} lines")
    texts = []
    for number, row in read_jsonl(path, "--calib"):
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ValueError(f"--calib {path}: line {number} needs a string 'text' field")
        texts.append(row["text"])
    return texts


def calibration_sequences(texts: list[str], tokenizer: Tokenizer, num_samples: int, seq_len: int,
                          seed: int = 0) -> list[list[int]]:
    """Up to `num_samples` token sequences of `seq_len` tokens (see the module docstring)."""
    if num_samples <= 0:
        raise ValueError(f"--num-samples must be a positive integer, got {num_samples}")
    if seq_len < 2:
        raise ValueError(f"calibration sequence length must be at least 2 tokens, got {seq_len}")
    stream: list[int] = []
    separator = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    for text in texts:
        stream += tokenizer.encode(text, add_special_tokens=False) + separator
    if len(stream) < MIN_TOKENS:
        raise ValueError(f"--calib: the calibration text has {len(stream)} tokens; at least {MIN_TOKENS} are needed")
    sequences = [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)] or [stream[:seq_len]]
    if len(sequences) > num_samples:
        order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(seed))[:num_samples]
        sequences = [sequences[i] for i in sorted(order.tolist())]
    return sequences

"""Token data for training and evaluation: a directory of flat uint16 token streams.

Layout of a data directory (what ``--data`` points at)::

    DATA/
      meta.json      {"vocab_size": 8192, "eos_token_id": 0, "dtype": "uint16", ...}
      train.bin      uint16 token ids of all training documents, each followed by eos
      heldout.bin    the same for the held-out documents

    train.bin:  [doc 0 tokens][eos][doc 1 tokens][eos] ...

Training samples random windows of ``seq_len + 1`` tokens from train.bin (windows may cross document
boundaries; the eos token marks them); evaluation reads held-out.bin in consecutive windows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

META = "meta.json"
TRAIN = "train.bin"
HELDOUT = "heldout.bin"


@dataclass(frozen=True)
class TokenData:
    """The two token streams of a data directory, as numpy arrays (memory-mapped)."""

    train: np.ndarray
    heldout: np.ndarray
    vocab_size: int
    eos_token_id: int

    @classmethod
    def load(cls, data_dir: str | Path) -> TokenData:
        """Open a data directory written by :func:`write_token_data`."""
        root = Path(data_dir)
        if not (root / META).is_file():
            raise ValueError(f"data: {root} has no {META}; expected a directory with {META}, {TRAIN}, {HELDOUT}")
        meta = json.loads((root / META).read_text())
        if meta.get("dtype", "uint16") != "uint16":
            raise ValueError(f"data: dtype must be 'uint16', got {meta.get('dtype')!r}")
        arrays = [np.memmap(root / name, dtype=np.uint16, mode="r") for name in (TRAIN, HELDOUT)]
        return cls(arrays[0], arrays[1], int(meta["vocab_size"]), int(meta["eos_token_id"]))


def write_token_data(
    out_dir: str | Path, train: np.ndarray, heldout: np.ndarray, vocab_size: int, eos_token_id: int,
    extra_meta: dict | None = None,
) -> None:
    """Write a data directory from two flat token arrays."""
    if vocab_size > 65536:
        raise ValueError(f"vocab_size must be <= 65536 for uint16 storage, got {vocab_size}")
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    np.asarray(train, dtype=np.uint16).tofile(root / TRAIN)
    np.asarray(heldout, dtype=np.uint16).tofile(root / HELDOUT)
    meta = {"vocab_size": vocab_size, "eos_token_id": eos_token_id, "dtype": "uint16",
            "train_tokens": int(len(train)), "heldout_tokens": int(len(heldout)), **(extra_meta or {})}
    (root / META).write_text(json.dumps(meta, indent=2) + "\n")


class WindowSampler:
    """Draws batches of random ``seq_len + 1`` windows from a token stream kept on the device.

    The same seed gives the same batches, so two runs (distilled and plain cross-entropy) see the same data.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, device: torch.device, seed: int):
        if len(tokens) < seq_len + 2:
            raise ValueError(f"data: the train stream has {len(tokens)} tokens, need more than seq_len + 1 = "
                             f"{seq_len + 1}")
        self.tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int32)).to(device)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.offsets = torch.arange(seq_len + 1, device=device)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def next_windows(self) -> torch.Tensor:
        """``[batch_size, seq_len + 1]`` int64 random windows of the stream."""
        high = len(self.tokens) - self.seq_len - 1
        starts = torch.randint(0, high, (self.batch_size,), device=self.tokens.device, generator=self.generator)
        return self.tokens[starts[:, None] + self.offsets].long()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (inputs, targets), each ``[batch_size, seq_len]`` int64, targets shifted by one."""
        window = self.next_windows()
        return window[:, :-1], window[:, 1:]


def eval_windows(tokens: np.ndarray, seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """Cut a stream into consecutive non-overlapping windows of ``seq_len + 1`` tokens (CPU, int64).

    Window i covers tokens ``[i*seq_len, (i+1)*seq_len]``: each token after the first is predicted once.
    """
    n = len(tokens) if max_tokens is None else min(len(tokens), max_tokens + 1)
    count = (n - 1) // seq_len
    if count == 0:
        raise ValueError(f"data: {n} tokens are too few for one evaluation window of {seq_len + 1}")
    flat = torch.from_numpy(np.asarray(tokens[: count * seq_len + 1], dtype=np.int64))
    starts = torch.arange(count)[:, None] * seq_len
    return flat[starts + torch.arange(seq_len + 1)]

"""Token data for training Medusa heads on the demo model: this interpreter's standard library, tokenized.

Writes a `lamina distill` data directory (meta.json, train.bin, heldout.bin; see lamina/distill/data.py).
Files are read and filtered as in corpus.py (64 bytes .. 200 KB, UTF-8, no special-token strings), deduped
by content and ordered by content hash. Held out, by file: the stdlib files the demo model itself held out
(scripts/demo_model/heldout_files.txt, so neither the target nor the heads saw them) and every file whose
content hash falls in the first --heldout-permille. Train files are taken in hash order up to
--max-train-tokens, held-out files up to --max-heldout-tokens.

    PYTHONPATH=. python3 scripts/demo_model/medusa_data.py --out /tmp/medusa-data
"""
from __future__ import annotations

import argparse
import hashlib
import sysconfig
import time
from pathlib import Path

import numpy as np
from corpus import Source, list_files, read_source
from tokenizers import Tokenizer

from lamina.distill.data import write_token_data

HERE = Path(__file__).resolve().parent
DEMO_MODEL = HERE.parents[1] / "lamina" / "assets" / "demo-model"


def stdlib_sources(root: Path) -> list[Source]:
    """The stdlib's ``*.py`` files (no site-packages), filtered, deduped, in content-hash order."""
    unique: dict[str, Source] = {}
    for item in list_files([("stdlib", root)]):
        src = read_source(item, 64, 200_000)
        if src is not None:
            unique.setdefault(src.digest, src)
    return sorted(unique.values(), key=lambda s: s.digest)


def encode_capped(tok: Tokenizer, sources: list[Source], eos_id: int, max_tokens: int) -> tuple[np.ndarray, int]:
    """Whole files, each followed by eos, until ``max_tokens``; returns (tokens, files used)."""
    parts: list[np.ndarray] = []
    total = 0
    for count, src in enumerate(sources):
        if total >= max_tokens:
            return np.concatenate(parts), count
        ids = np.asarray(tok.encode(src.text, add_special_tokens=False).ids + [eos_id], dtype=np.uint16)
        parts.append(ids)
        total += len(ids)
    return np.concatenate(parts), len(sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="data directory to write")
    parser.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"], help="standard library directory")
    parser.add_argument("--tokenizer", default=str(DEMO_MODEL), help="directory with tokenizer.json")
    parser.add_argument("--heldout-list", default=str(HERE / "heldout_files.txt"),
                        help="names held out by the target (stdlib/... lines are used)")
    parser.add_argument("--heldout-permille", type=int, default=30, help="further held-out files, per mille")
    parser.add_argument("--max-train-tokens", type=int, default=4_000_000)
    parser.add_argument("--max-heldout-tokens", type=int, default=400_000)
    args = parser.parse_args()
    start = time.perf_counter()
    target_heldout = set(Path(args.heldout_list).read_text().split())
    sources = stdlib_sources(Path(args.stdlib).resolve())
    is_held = [s.name in target_heldout or s.bucket(1000) < args.heldout_permille for s in sources]
    tok_path = Path(args.tokenizer) / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_path))
    eos_id = tok.token_to_id("<|endoftext|>")
    held_sources = sorted((s for s, h in zip(sources, is_held) if h),  # the target's own held-out files first
                          key=lambda s: (s.name not in target_heldout, s.digest))
    train, n_train = encode_capped(tok, [s for s, h in zip(sources, is_held) if not h], eos_id,
                                   args.max_train_tokens)
    heldout, n_held = encode_capped(tok, held_sources, eos_id, args.max_heldout_tokens)
    meta = {
        "source": f"Python {'.'.join(map(str, __import__('sys').version_info[:3]))} stdlib: {args.stdlib}",
        "train_files": n_train, "heldout_files": n_held,
        "heldout_names": sorted(s.name for s in held_sources[:n_held]),
        "tokenizer_sha256": hashlib.sha256(tok_path.read_bytes()).hexdigest(),
        "options": {k: v for k, v in vars(args).items() if k != "out"},
    }
    write_token_data(args.out, train, heldout, tok.get_vocab_size(), eos_id, meta)
    print(f"{len(sources)} files: {n_train} train ({len(train):,} tokens), {n_held} held out "
          f"({len(heldout):,} tokens) in {time.perf_counter() - start:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()

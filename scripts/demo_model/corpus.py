"""Build the demo corpus: the Python sources of the interpreter running this script.

Sources: the standard library and site-packages of `sys.executable`. Files are read as UTF-8, filtered
(size, NUL bytes, literal special-token strings), deduplicated by content (sha256, the smallest name
wins), ordered by content hash, capped at --max-bytes and split by file: a file is held out when its
content hash falls in the first --heldout-permille of the hash space. The split depends only on a file's
content, so two machines with slightly different packages never put one file on both sides.

A few training files also give chat examples ("write function X" -> its source) in the template the
tokenizer ships, so that the chat template and the `<|end|>` stop token mean something to the model.

Writes to OUT: train.jsonl, heldout.jsonl ({"text": ...} per line), heldout_files.txt, manifest.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import site
import sys
import sysconfig
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from chat_examples import chat_documents

SPECIAL_TOKENS = ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", ".git"}


@dataclass(frozen=True)
class Source:
    """One deduplicated file: a portable name ("stdlib/json/decoder.py"), its text and content hash."""

    name: str
    text: str
    digest: str

    def bucket(self, modulus: int, salt: int = 0) -> int:
        """A deterministic number in [0, modulus) from the content hash (salt picks other hex digits)."""
        return int(self.digest[8 * salt: 8 * salt + 8], 16) % modulus


def source_roots() -> list[tuple[str, Path]]:
    """(label, directory) pairs: the stdlib and each distinct site-packages directory."""
    paths = sysconfig.get_paths()
    roots = [("stdlib", Path(paths["stdlib"]).resolve())]
    sites = sorted({Path(p).resolve() for p in (paths["purelib"], paths["platlib"], *site.getsitepackages())})
    for i, path in enumerate(p for p in sites if p.is_dir()):
        roots.append(("site-packages" if i == 0 else f"site-packages{i + 1}", path))
    return roots


def list_files(roots: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """All ``*.py`` files under the roots as (portable name, path), sorted; no nested site dirs."""
    found = []
    for label, root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            rel = Path(dirpath).relative_to(root)
            found += [(f"{label}/{(rel / f).as_posix()}", Path(dirpath, f)) for f in filenames if f.endswith(".py")]
    return sorted(found)


def read_source(item: tuple[str, Path], min_bytes: int, max_bytes: int) -> Source | None:
    """Read and filter one file; None when it is skipped."""
    name, path = item
    try:
        size = path.stat().st_size
        if not min_bytes <= size <= max_bytes:
            return None
        data = path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\x00" in text or any(tok in text for tok in SPECIAL_TOKENS):
        return None
    return Source(name, text, hashlib.sha256(data).hexdigest())


def collect(min_bytes: int, max_bytes: int, max_total: int, workers: int) -> tuple[list[Source], int]:
    """Read, dedupe (smallest name per content), order by hash, cap; returns (sources, files seen)."""
    files = list_files(source_roots())
    with ThreadPoolExecutor(workers) as pool:
        sources = [s for s in pool.map(lambda f: read_source(f, min_bytes, max_bytes), files, chunksize=64) if s]
    unique: dict[str, Source] = {}
    for src in sources:  # sorted by name, so the first per digest is the smallest name
        unique.setdefault(src.digest, src)
    kept, total = [], 0
    for src in sorted(unique.values(), key=lambda s: s.digest):
        if total + len(src.text) > max_total:
            break
        kept.append(src)
        total += len(src.text)
    return kept, len(files)


def write_jsonl(path: Path, texts: list[str]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")


def _digest_of(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


def build(args: argparse.Namespace) -> dict:
    """Build the corpus into ``args.out`` and return the manifest."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sources, seen = collect(args.min_bytes, args.max_bytes, args.max_total_bytes, args.workers)
    heldout = [s for s in sources if s.bucket(1000) < args.heldout_permille]
    train = [s for s in sources if s.bucket(1000) >= args.heldout_permille]
    chat_from = [s for s in train if s.bucket(1000, salt=1) < args.chat_permille]
    with ProcessPoolExecutor(args.workers) as pool:
        chats = list(pool.map(chat_documents, [s.text for s in chat_from], chunksize=16))
    by_digest = {s.digest: c for s, c in zip(chat_from, chats)}
    train_texts = []
    for src in train:  # each source's chat examples follow it
        train_texts += [src.text, *by_digest.get(src.digest, [])]
    write_jsonl(out / "train.jsonl", train_texts)
    write_jsonl(out / "heldout.jsonl", [s.text for s in heldout])
    held_names = sorted(s.name for s in heldout)
    (out / "heldout_files.txt").write_text("\n".join(held_names) + "\n")
    manifest = {
        "python": sys.version.split()[0], "roots": [f"{label}: {path}" for label, path in source_roots()],
        "files_seen": seen, "files_kept": len(sources), "train_files": len(train), "heldout_files": len(heldout),
        "heldout_fraction": round(len(heldout) / max(1, len(sources)), 4),
        "chat_examples": sum(len(c) for c in chats),
        "train_chars": sum(len(s.text) for s in train), "heldout_chars": sum(len(s.text) for s in heldout),
        "train_names_sha256": _digest_of(sorted(s.name for s in train)),
        "heldout_names_sha256": _digest_of(held_names),
        "options": {k: v for k, v in vars(args).items() if k != "out"},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--max-total-bytes", type=int, default=400_000_000, help="cap on kept source characters")
    parser.add_argument("--min-bytes", type=int, default=64, help="skip smaller files")
    parser.add_argument("--max-bytes", type=int, default=200_000, help="skip larger files (generated tables)")
    parser.add_argument("--heldout-permille", type=int, default=15, help="held-out share of files, per mille")
    parser.add_argument("--chat-permille", type=int, default=150, help="share of train files mined for chat")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    manifest = build(parser.parse_args())
    print(json.dumps({k: v for k, v in manifest.items() if k != "options"}, indent=2))


if __name__ == "__main__":
    main()

"""Stream checkpoint tensors out of safetensors files, one file open at a time.

Only safetensors is read: .bin / .pt checkpoints are pickles, which can run arbitrary code
when loaded, so lamina refuses them on purpose (convert them with HF's `save_pretrained`).

Under tensor parallelism (`iterate_weight_slices`) nothing is read up front: each tensor comes as a
`LazySlice` that the layer's weight loader narrows to its rank's part; only that part is read from the file.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import torch
from safetensors import safe_open

from lamina.models.names import format_names

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _index_files(index_path: Path) -> list[Path]:
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{index_path}: not a valid safetensors index ({exc!r})") from None
    files = [index_path.parent / name for name in dict.fromkeys(weight_map.values())]
    absent = [f.name for f in files if not f.is_file()]
    if absent:
        raise ValueError(f"{index_path}: shard file(s) listed in the index are missing: {format_names(absent)}")
    return files


def safetensors_files(model_dir: str) -> list[Path]:
    """The checkpoint files in load order: the index's shards, or the single file, or all *.safetensors."""
    path = Path(model_dir)
    if (path / INDEX_FILE).is_file():
        return _index_files(path / INDEX_FILE)
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in path.glob("*") if p.suffix in (".bin", ".pt", ".pth"))
    hint = (f" (found {format_names(pickles)}: pickle checkpoints are not loaded, on purpose, because "
            f"unpickling can run arbitrary code; re-save the model with safetensors)") if pickles else ""
    raise ValueError(f"model: no *.safetensors weights in {model_dir!r}{hint}")


def iterate_weights(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (checkpoint name, CPU tensor) for every tensor of the checkpoint, file by file."""
    for file in safetensors_files(model_dir):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


class LazySlice:
    """A checkpoint tensor not read yet: `narrow` it (as a torch tensor), then `materialize()` reads exactly
    that part from the safetensors file (safetensors' get_slice; no full copy)."""

    def __init__(self, source: Any, bounds: tuple[tuple[int, int], ...]) -> None:
        self._source = source  # safetensors' slice object: indexable with a tuple of slices
        self._bounds = bounds  # (start, stop) per dim

    @classmethod
    def of(cls, source: Any) -> LazySlice:
        return cls(source, tuple((0, n) for n in source.get_shape()))

    @property
    def shape(self) -> torch.Size:
        return torch.Size(stop - start for start, stop in self._bounds)

    def dim(self) -> int:
        return len(self._bounds)

    def narrow(self, dim: int, start: int, length: int) -> LazySlice:
        dim = dim % len(self._bounds)
        lo, hi = self._bounds[dim]
        if start < 0 or length < 0 or lo + start + length > hi:
            raise ValueError(f"narrow({dim}, {start}, {length}) is outside a tensor of shape {tuple(self.shape)}")
        bounds = list(self._bounds)
        bounds[dim] = (lo + start, lo + start + length)
        return LazySlice(self._source, tuple(bounds))

    def materialize(self) -> torch.Tensor:
        if not self._bounds:
            return self._source[()]
        return self._source[tuple(slice(start, stop) for start, stop in self._bounds)]


def iterate_weight_slices(model_dir: str) -> Iterator[tuple[str, LazySlice]]:
    """Yield (checkpoint name, LazySlice) for every tensor, file by file (each file open while its tensors
    are loaded)."""
    for file in safetensors_files(model_dir):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, LazySlice.of(f.get_slice(name))

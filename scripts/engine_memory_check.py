"""Is an engine's GPU memory given back when the engine is dropped? (several engines in one process: benchmarks,
notebooks). Builds the demo model's engine with each option set, generates, drops it and measures what stays
allocated; when the weights stay, lists the reference cycles they hang from (the heap frozen at start-up,
lamina.engine.engine.freeze_heap, keeps cyclic garbage alive until it is thawed).

    python scripts/engine_memory_check.py [--result-file F]
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import sys
import weakref
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lamina import DEMO_DRAFT, DEMO_MODEL, LLM, SamplingParams  # noqa: E402

VARIANTS = {"graphs": {}, "eager": {"enforce_eager": True},
            "graphs+ngram": {"speculative_config": {"method": "ngram"}},
            "graphs+draft": {"speculative_config": {"method": "draft_model", "model": DEMO_DRAFT,
                                                    "num_speculative_tokens": 3}}}


def _hop(obj: object, nxt: object) -> str:
    """How `obj` refers to `nxt`: a dict's key, a sequence's index, a function's name, else obj's type."""
    if isinstance(obj, dict):
        key = next((k for k, v in obj.items() if v is nxt), "?")
        return f"[{key!r}]"
    if isinstance(obj, (list, tuple)):
        return f"{type(obj).__name__}[{next((i for i, v in enumerate(obj) if v is nxt), '?')}]"
    if callable(obj) and hasattr(obj, "__qualname__"):
        return f"<{type(obj).__name__} {obj.__qualname__}>"
    return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


def _cycle_through(start: object, garbage: dict[int, object]) -> list[str] | None:
    """The shortest chain of references start -> ... -> start among `garbage`, described hop by hop."""
    parent: dict[int, object | None] = {id(start): None}
    queue = collections.deque([start])
    while queue:
        obj = queue.popleft()
        for ref in gc.get_referents(obj):
            if ref is start:
                path = [obj]
                while parent[id(path[-1])] is not None:
                    path.append(parent[id(path[-1])])
                path.reverse()
                return [_hop(a, b) for a, b in zip(path, path[1:] + [start])]
            if id(ref) in garbage and id(ref) not in parent:
                parent[id(ref)] = obj
                queue.append(ref)
    return None


def garbage_cycles(max_cycles: int = 6) -> dict:
    """Collect with DEBUG_SAVEALL (call right after gc.unfreeze()): what the dropped engine left in cycles: the
    lamina types among the garbage and the distinct cycles through them."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    gc.set_debug(0)
    garbage = {id(o): o for o in gc.garbage}
    types = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                                if type(o).__module__.startswith("lamina"))
    cycles: list[list[str]] = []
    for obj in gc.garbage:
        if len(cycles) >= max_cycles or not type(obj).__module__.startswith("lamina"):
            continue
        cycle = _cycle_through(obj, garbage)
        if cycle and all(set(cycle) != set(c) for c in cycles):
            cycles.append(cycle)
    gc.garbage.clear()
    return dict(garbage_objects=len(garbage), lamina_types=dict(types.most_common(15)), cycles=cycles)


def check(name: str, options: dict) -> dict:
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    llm = LLM(model=DEMO_MODEL, kv_cache_memory_bytes=1 << 30, **options)
    llm.generate(["def fib(n):", "The river"], SamplingParams(max_tokens=32, temperature=0.6), use_tqdm=False)
    model = llm.engine.executor.worker.model
    weight = next(model.parameters())
    weight_ref = weakref.ref(weight)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    loaded = torch.cuda.memory_allocated() - base
    del llm, model, weight
    gc.collect()
    torch.cuda.empty_cache()
    row = dict(variant=name, weights_mb=weights / 2**20, allocated_mb=loaded / 2**20,
               left_mb=(torch.cuda.memory_allocated() - base) / 2**20, weight_alive=weight_ref() is not None)
    gc.unfreeze()  # what stays is frozen: thawed, the collector finds it
    if row["weight_alive"]:
        row.update(garbage_cycles())
    gc.collect()
    torch.cuda.empty_cache()
    row["left_after_unfreeze_mb"] = (torch.cuda.memory_allocated() - base) / 2**20
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--result-file", type=Path)
    args = parser.parse_args()
    rows = [check(name, options) for name, options in VARIANTS.items()]
    for row in rows:
        print(f"{row['variant']:14s} weights {row['weights_mb']:7.1f} MB, engine {row['allocated_mb']:7.1f} MB, "
              f"left after del + collect {row['left_mb']:7.1f} MB (weight alive: {row['weight_alive']}), "
              f"after unfreeze {row['left_after_unfreeze_mb']:7.1f} MB")
        if "cycles" in row:
            print(f"    {row['garbage_objects']} objects in cycles; lamina types: {row['lamina_types']}")
            for cycle in row["cycles"]:
                print("    cycle: " + " -> ".join(cycle))
    if args.result_file:
        args.result_file.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

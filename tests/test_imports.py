"""The package's dependencies point one way (DESIGN §2): the top-level subpackages and modules of lamina
form no import cycle, and nothing below the engine imports the engine (its Request or its scheduler)."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import lamina

ROOT = Path(lamina.__file__).parent
BELOW_THE_ENGINE = ("executor", "worker", "layers", "kv", "models", "attention", "kernels", "loader")


def _unit(path: Path) -> str:
    """The top-level part of lamina a file belongs to: its subpackage, or the module itself."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return parts[0]


def _imports(path: Path) -> set[str]:
    """The lamina modules imported anywhere in the file (also inside functions), as absolute names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lamina."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lamina."):
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:  # from .x import y: resolved from the file
            package = path.relative_to(ROOT.parent).parts[:-1]
            found.add(".".join([*package[:len(package) - node.level + 1], *filter(None, [node.module])]))
    return found


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], set[str]]]:
    edges: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        source = _unit(path)
        for module in _imports(path):
            target = module.split(".")[1]
            if target != source:
                edges[source].add(target)
                where[source, target].add(f"{path.relative_to(ROOT.parent)} imports {module}")
    return edges, where


def _reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(edges.get(node, ()))
    return False


def test_no_import_cycle_between_top_level_parts() -> None:
    edges, where = import_graph()
    cycles = [sorted(where[a, b]) for a in edges for b in edges[a] if _reaches(edges, b, a)]
    assert not cycles, "import cycles:\n" + "\n".join(map(str, cycles))


def test_nothing_below_the_engine_imports_it() -> None:
    _, where = import_graph()
    upward = [sorted(files) for (source, target), files in where.items()
              if source in BELOW_THE_ENGINE and target == "engine"]
    assert not upward, upward
    assert not where.get(("worker", "executor")), "the worker does not know its executor"


def test_the_check_sees_a_cycle(tmp_path: Path) -> None:
    """The walk itself: an edge back up is a cycle."""
    edges = {"engine": {"worker"}, "worker": {"engine"}}
    assert _reaches(edges, "worker", "engine") and not _reaches({"engine": {"worker"}}, "worker", "engine")

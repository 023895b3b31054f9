"""Write lamina/quantize/data/heldout_functions.jsonl: the code-completion cases of the accuracy gate.

Functions of four CPython 3.11 standard-library files that the demo model never trained on (their 3.12 versions
are in scripts/demo_model/heldout_files.txt) and that neither the gate's perplexity text nor the calibration
text uses. Kept: undecorated functions and methods whose body (after the docstring) has 3 to 24 lines, dedented
to the top level. Run with the interpreter whose stdlib is wanted: python3 scripts/make_heldout_functions.py
"""
from __future__ import annotations

import ast
import hashlib
import json
import sysconfig
import textwrap
from pathlib import Path

FILES = ["threading.py", "http/client.py", "xml/sax/handler.py", "ctypes/__init__.py"]
OUT = Path(__file__).resolve().parents[1] / "lamina" / "quantize" / "data" / "heldout_functions.jsonl"


def functions(path: Path) -> list[tuple[str, str]]:
    source = path.read_text()
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef) or node.decorator_list:
            continue
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        if not body:
            continue
        num_body = node.end_lineno - body[0].lineno + 1
        if 3 <= num_body <= 24:
            text = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))
            out.append((node.name, text))
    return out


def main() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for name in FILES:
        for func, text in functions(stdlib / name):
            rows.append({"source": f"Lib/{name}", "function": func,
                         "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text})
    OUT.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{len(rows)} functions -> {OUT}")


if __name__ == "__main__":
    main()

"""Chat examples mined from Python sources: a request for a documented function, and its source as answer.

The text matches what the shipped chat template renders for ``[{"role": "user", ...}]`` with
``add_generation_prompt=True``, followed by the answer and ``<|end|>``::

    <|user|>
    Write a Python function `name(args)`: first paragraph of its docstring<|end|>
    <|assistant|>
    def name(args):
        ...<|end|>
"""
from __future__ import annotations

import ast
import warnings
import zlib

CHAT_FORMAT = "<|user|>\n{user}<|end|>\n<|assistant|>\n{assistant}<|end|>\n"
REQUESTS = (
    "Write a Python function `{signature}`: {summary}",
    "Implement `{signature}` in Python. {summary}",
    "{summary}\nWrite it as a Python function `{signature}`.",
)


def _parse(text: str) -> ast.Module | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarning on odd escapes in old sources
        try:
            return ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None


def _request(node: ast.FunctionDef | ast.AsyncFunctionDef, doc: str) -> str:
    summary = " ".join(doc.strip().split("\n\n")[0].split())[:300]
    signature = f"{node.name}({ast.unparse(node.args)})"
    template = REQUESTS[zlib.crc32(node.name.encode()) % len(REQUESTS)]
    return template.format(signature=signature, summary=summary)


def chat_documents(text: str, max_per_file: int = 3, min_chars: int = 80, max_chars: int = 3000) -> list[str]:
    """Up to ``max_per_file`` chat documents from the documented top-level functions of ``text``."""
    tree = _parse(text)
    if tree is None:
        return []
    docs = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        source = ast.get_source_segment(text, node) if doc else None
        if not doc or source is None or not min_chars <= len(source) <= max_chars:
            continue
        docs.append(CHAT_FORMAT.format(user=_request(node, doc), assistant=source))
        if len(docs) >= max_per_file:
            break
    return docs

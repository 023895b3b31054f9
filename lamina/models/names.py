"""Lists of names (checkpoint tensors, files) in error messages: enough to act on, never a flood.

Used by the models' weight loading and by the loader; it lives here, below the loader, so that the
models never import lamina.loader.
"""
from __future__ import annotations

from collections.abc import Iterable


def format_names(names: Iterable[str], limit: int = 5) -> str:
    """'a, b, c ... and N more': the first `limit` names in sorted order, then how many were left out."""
    ordered = sorted(names)
    shown = ", ".join(ordered[:limit])
    return shown if len(ordered) <= limit else f"{shown} ... and {len(ordered) - limit} more"

"""format_names: the lists of names in error messages (checkpoint tensors, files)."""
from __future__ import annotations

from lamina.models.names import format_names


def test_format_names_truncates() -> None:
    assert format_names(["b", "a"]) == "a, b"
    assert format_names([f"w{i}" for i in range(8)], limit=3) == "w0, w1, w2 ... and 5 more"

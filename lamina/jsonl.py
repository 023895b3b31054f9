"""Reading JSON Lines input files (`lamina generate --input`, `lamina quantize --calib`)."""
from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path: str, flag: str) -> list[tuple[int, object]]:
    """(line number, parsed value) of every non-blank line; a ValueError naming `flag`, the file and the line
    for one that is not JSON."""
    values = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except json.JSONDecodeError as err:
            raise ValueError(f"{flag} {path}: line {number} is not valid JSON ({err.msg})") from None
    return values

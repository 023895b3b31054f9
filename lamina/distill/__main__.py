"""`python -m lamina.distill ...`: the same as `lamina distill ...` (no engine import needed)."""
from __future__ import annotations

import argparse
import sys

from .cli import DESCRIPTION, add_arguments, run


def main(argv: list[str] | None = None) -> int:
    """Parse the `lamina distill` options and run it."""
    parser = argparse.ArgumentParser(
        prog="lamina distill", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

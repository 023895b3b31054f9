"""What the CPU benchmarks on the demo model share: their common flags, the facts of the machine they ran on,
and writing the report."""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys

import torch

from lamina import DEMO_MODEL


def cpu_bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """--model (the demo model), --new-tokens, --result-file, --disable-tqdm; a bench adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--result-file", help="write the JSON result here")
    parser.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    return parser


def run_info() -> dict:
    """Threads, torch, hardware, date and the command line of this run."""
    return {"threads": torch.get_num_threads(), "torch": torch.__version__,
            "hardware": platform.processor() or platform.machine(), "date": datetime.date.today().isoformat(),
            "command": " ".join(sys.argv)}


def write_report(path: str | None, report: dict) -> None:
    """The report as compact JSON (benchmarks/results keeps its records minified: the repository travels to the
    device machine, 64 MiB at most)."""
    if path:
        with open(path, "w") as f:
            json.dump(report, f, separators=(",", ":"))
            f.write("\n")

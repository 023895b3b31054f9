"""W4 (online serving) over scheduler settings: one `lamina serve` per setting, driven by the `lamina bench serve`
client at a few request rates (issue #9).

    python -m lamina.bench.w4_sweep --result-file w4_sweep.json     # H200: 4 servers x 3 rates, ~3-4 min
    python -m lamina.bench.w4_sweep --dry-run                       # CPU, tiny shape, 2 servers, short requests

Each setting starts `python -m lamina.cli serve` in a subprocess on dummy weights of the shape (config.json from
lamina.bench.offline, --load-format dummy, --skip-tokenizer-init: prompts are token ids, the stream carries
token ids), waits for /health, sends one short warm-up request, then for each rate W1-distributed requests
(prompts and outputs 100..1024 tokens, ignore_eos) under Poisson arrivals. Each rate draws its own prompts
(seed + rate index), so the prefix cache never serves a prompt that an earlier rate sent. The first setting is
the server's defaults (no scheduler flags): what `lamina serve` users get. Prints a table last, writes JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

GRID = ["defaults", "128x2048", "256x8192", "512x16384"]
DRY_GRID = ["defaults", "4x64"]
_EFFECTIVE = re.compile(r"max_num_seqs (\d+), max_num_batched_tokens (\d+)")


@dataclass(frozen=True)
class Setting:
    """One server: None = the engine's default for the device and usage."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    @property
    def label(self) -> str:
        return "defaults" if self.max_num_seqs is None else f"{self.max_num_seqs} / {self.max_num_batched_tokens}"

    @classmethod
    def parse(cls, text: str) -> Setting:
        if text == "defaults":
            return cls()
        seqs, _, tokens = text.partition("x")
        if not (seqs.isdigit() and tokens.isdigit()):
            raise ValueError(f"--grid: expected 'defaults' or SEQSxTOKENS (e.g. 256x8192), got {text!r}")
        return cls(int(seqs), int(tokens))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(config_path: Path, args: argparse.Namespace, setting: Setting, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "lamina.cli", "serve", str(config_path), "--load-format", "dummy",
           "--skip-tokenizer-init", "--served-model-name", args.shape, "--port", str(port), "--log-level", "INFO",
           "--uvicorn-log-level", "warning", "--dtype", args.dtype, "--device", args.device]
    if args.dry_run:
        cmd += ["--kv-cache-memory-bytes", str(1 << 26), "--max-model-len", "256"]
    if setting.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(setting.max_num_seqs),
                "--max-num-batched-tokens", str(setting.max_num_batched_tokens)]
    return cmd


class Server:
    """`lamina serve` in a subprocess, its output in a log file; stopped with SIGTERM (uvicorn's graceful exit)."""

    def __init__(self, cmd: list[str], port: int, log_path: Path) -> None:
        self.url, self.log_path = f"http://127.0.0.1:{port}", log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until GET /health answered 200; RuntimeError with the log's tail if the server died first."""
        import httpx

        start = time.perf_counter()
        while time.perf_counter() - start < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return time.perf_counter() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the server was not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def effective(self) -> tuple[int | None, int | None]:
        """The scheduler settings the server logged at start-up."""
        match = _EFFECTIVE.search(self.log_path.read_text(errors="replace"))
        return (int(match[1]), int(match[2])) if match else (None, None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def bench_args(args: argparse.Namespace, url: str, seed: int) -> argparse.Namespace:
    """The `lamina bench serve` options of one rate's request set."""
    from lamina.bench.cli import add_serve_arguments

    argv = ["--base-url", url, "--num-prompts", str(args.num_prompts), "--ignore-eos", "--seed", str(seed),
            "--temperature", str(args.temperature)]
    if args.dry_run:
        argv += ["--dataset", "random", "--random-input-len", "24", "--random-output-len", "12",
                 "--random-range-ratio", "0.5"]
    else:
        argv += ["--dataset", "w1"]
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv + (["--disable-tqdm"] if args.disable_tqdm else []))


def plan(args: argparse.Namespace, url: str) -> list[tuple[Any, list[Any], float]]:
    """(client config, requests, rate) per rate; each rate's requests drawn with its own seed."""
    from lamina.bench.cli import client_config, dataset_config, fitted_requests

    runs = []
    for index, rate in enumerate(args.request_rates):
        bargs = bench_args(args, url, args.seed + index)
        cfg, served = client_config(bargs)
        runs.append((cfg, fitted_requests(dataset_config(bargs, served.limits), served.limits), rate))
    return runs


async def drive(runs: list[tuple[Any, list[Any], float]]) -> list[Any]:
    """One short warm-up request, then each rate in order: a RunResult per rate."""
    from lamina.bench.datasets import SampleRequest
    from lamina.bench.serve import Connector, run_rate, warm_up

    cfg, requests, _ = runs[0]
    prompt = list(requests[0].prompt[:32])
    await warm_up(Connector(cfg), cfg, SampleRequest(prompt, len(prompt), 16))
    return [await run_rate(Connector(cfg), cfg, requests, rate) for cfg, requests, rate in runs]


def run_setting(config_path: Path, args: argparse.Namespace, setting: Setting, workdir: Path) -> dict[str, Any]:
    """Start the server, run every rate, stop it; a failure is recorded in the row, not raised."""
    from lamina.bench.metrics import parse_goodput, summarize

    port = free_port()
    row: dict[str, Any] = {"label": setting.label, "max_num_seqs": setting.max_num_seqs,
                           "max_num_batched_tokens": setting.max_num_batched_tokens, "points": [], "error": None}
    server = Server(server_command(config_path, args, setting, port), port,
                    workdir / f"server-{setting.label.replace(' / ', 'x')}.log")
    try:
        row["startup_s"] = server.wait_healthy(args.server_timeout)
        row["effective_max_num_seqs"], row["effective_max_num_batched_tokens"] = server.effective()
        slos = parse_goodput(args.goodput)
        for result in asyncio.run(drive(plan(args, server.url))):
            summary = summarize(result.records, result.duration_s, result.request_rate, None, slos, (50.0, 99.0))
            row["points"].append({**summary.to_json(), "client_cpu_util": result.client_cpu_util})
        if server.proc.poll() is not None:
            raise RuntimeError(f"the server died during the run:\n{server.log_tail()}")
    except Exception as err:  # noqa: BLE001 - one failed setting must not lose the others (a long GPU run)
        row["error"] = f"{type(err).__name__}: {err}"
        tqdm.write(f"w4 sweep: {setting.label} failed: {row['error']}\n{server.log_tail()}")
    finally:
        server.stop()
    return row


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\nW4 sweep | config (effective) | rate | ok | output tok/s | mean TTFT ms | p99 TTFT | mean TPOT ms | "
          "p99 ITL | client CPU")
    for row in rows:
        config = f"{row['label']} ({row.get('effective_max_num_seqs')} / {row.get('effective_max_num_batched_tokens')})"
        if row["error"]:
            print(f"{config} | failed: {row['error'].splitlines()[0][:100]}")
        for p in row["points"]:
            print(f"{config} | {p['request_rate']} | {p['completed']}/{p['completed'] + p['failed']} | "
                  f"{p['output_throughput']:.0f} | {_ms(p['mean_ttft_ms'])} | {_ms(p['p99_ttft_ms'])} | "
                  f"{_ms(p['mean_tpot_ms'])} | {_ms(p['p99_itl_ms'])} | {p['client_cpu_util']:.0%}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--result-file", default=None)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, 2 servers, 6 short requests")
    parser.add_argument("--shape", default="qwen3-0.6b", help="a shape of lamina.bench.offline.SHAPES")
    parser.add_argument("--grid", nargs="+", default=None, metavar="SETTING",
                        help=f"'defaults' or SEQSxTOKENS (default: {' '.join(GRID)})")
    parser.add_argument("--request-rates", nargs="+", type=float, default=None, metavar="R",
                        help="requests/s, inf = all at once (default: 8 32 inf)")
    parser.add_argument("--num-prompts", type=int, default=None, help="requests per rate (default 150)")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS", help="SLOs, e.g. ttft:500 tpot:50")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first rate's requests (+1 per rate)")
    parser.add_argument("--server-timeout", type=float, default=300.0, help="seconds to wait for /health")
    parser.add_argument("--disable-tqdm", action="store_true")
    args = parser.parse_args(argv)
    args.dtype, args.device = "bfloat16", "cuda"
    if args.dry_run:
        args.shape, args.dtype, args.device = "tiny", "float32", "cpu"
    args.grid = [Setting.parse(s) for s in args.grid or (DRY_GRID if args.dry_run else GRID)]
    args.request_rates = args.request_rates or ([16.0, math.inf] if args.dry_run else [8.0, 32.0, math.inf])
    args.num_prompts = args.num_prompts or (6 if args.dry_run else 150)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    import fastapi  # noqa: F401 - the server's dependencies, checked before the first server starts
    import httpx  # noqa: F401
    import uvicorn  # noqa: F401

    from lamina.bench.offline import write_config

    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        config_path = write_config(args.shape, workdir)
        for setting in tqdm(args.grid, desc="W4 sweep", unit="server", disable=args.disable_tqdm):
            rows.append(run_setting(config_path, args, setting, Path(workdir)))
    if args.result_file:
        report = {"command": "python -m lamina.bench.w4_sweep " + " ".join(argv), "shape": args.shape,
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "request_rates": [r if math.isfinite(r) else "inf" for r in args.request_rates],
                  "num_prompts": args.num_prompts, "temperature": args.temperature, "rows": rows}
        Path(args.result_file).write_text(json.dumps(report, indent=1))
    print_table(rows)
    return 1 if any(row["error"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

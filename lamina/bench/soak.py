"""A bounded soak of `lamina serve`: a steady mix of requests for a while, ~20% cancelled, a KV cache small
enough to force preemption; then nothing may be left behind.

    python -m lamina.bench.soak                          # 10 minutes on the demo model
    python -m lamina.bench.soak --duration 15 --concurrency 4 --result-file soak.json

Starts `python -m lamina.cli serve` in a subprocess, drives it (lamina/bench/soak_load.py), samples the
server's RSS and /metrics every few seconds, and checks at the end:

    every request not cancelled answered completely and well-formed (no 5xx, no error, no timeout)
    /health 200; running and waiting gauges 0; KV usage 0 (cached, evictable blocks count as free)
    RSS flat: the max after the warm-up (first 20% of the run) within 5% of the RSS at its end
    preemptions > 0 (else the KV cache was not small enough to test them)

Prints a table, writes JSON (--result-file); exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from tqdm import tqdm

from lamina import DEMO_MODEL
from lamina.bench.soak_load import LoadConfig, Tally, drive
from lamina.bench.soak_stats import Sample, rss_bytes, rss_trend, scrape

MB = 1 << 20


@dataclass(frozen=True)
class SoakConfig:
    model: str = DEMO_MODEL
    duration_s: float = 600.0
    concurrency: int = 12
    cancel_fraction: float = 0.2
    num_kv_blocks: int = 40
    max_model_len: int = 512
    max_num_seqs: int = 16
    sample_every_s: float = 5.0
    warmup_fraction: float = 0.2
    rss_tolerance: float = 0.05
    seed: int = 0


@dataclass
class Server:
    """A `lamina serve` subprocess on a free port; its output goes to a log file."""

    proc: subprocess.Popen
    url: str
    log: Path
    served_name: str

    @classmethod
    def start(cls, config: SoakConfig, log: Path) -> Server:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        argv = [sys.executable, "-m", "lamina.cli", "serve", config.model, "--port", str(port),
                "--num-kv-blocks", str(config.num_kv_blocks), "--max-model-len", str(config.max_model_len),
                "--max-num-seqs", str(config.max_num_seqs), "--uvicorn-log-level", "warning"]
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        server = cls(proc, f"http://127.0.0.1:{port}", log, Path(config.model).name)
        server.wait_healthy()
        return server

    def wait_healthy(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lamina serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"lamina serve did not become healthy in {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@dataclass
class Monitor:
    """Samples the server's RSS and /metrics every `every_s` seconds while the load runs."""

    server: Server
    every_s: float
    samples: list[Sample] = field(default_factory=list)

    def sample(self, t0: float) -> Sample:
        metrics = scrape(self.server.url)
        s = Sample(round(time.monotonic() - t0, 2), rss_bytes(self.server.proc.pid), metrics)
        self.samples.append(s)
        return s

    async def run(self, t0: float, duration_s: float, tally: Tally) -> None:
        with tqdm(total=round(duration_s), unit="s", desc="soak", dynamic_ncols=True) as bar:
            while (elapsed := time.monotonic() - t0) < duration_s:
                s = await asyncio.to_thread(self.sample, t0)
                bar.update(min(round(elapsed), bar.total) - bar.n)
                bar.set_postfix(sent=tally.sent, ok=tally.completed, cancel=tally.cancelled,
                                err=sum(tally.errors.values()), rss=f"{s.rss / MB:.0f}M",
                                preempt=int(s.metrics.get("lamina:num_preemptions_total", 0)))
                await asyncio.sleep(min(self.every_s, max(0.0, duration_s - elapsed)))
            bar.update(bar.total - bar.n)


def settle(server: Server, timeout: float = 60.0) -> dict[str, float]:
    """/metrics once the engine has drained (or the last scrape, at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(server.url)
        idle = m["lamina:num_requests_running"] == m["lamina:num_requests_waiting"] == 0
        if (idle and m["lamina:kv_cache_usage_perc"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.5)


async def _load_and_watch(config: SoakConfig, server: Server, tally: Tally, monitor: Monitor) -> None:
    load = LoadConfig(server.url, server.served_name, config.duration_s, config.concurrency,
                      config.cancel_fraction, config.seed)
    t0 = time.monotonic()
    await asyncio.gather(drive(load, tally), monitor.run(t0, config.duration_s, tally))
    await asyncio.to_thread(monitor.sample, t0)  # after the last requests came back


def evaluate(config: SoakConfig, tally: Tally, samples: list[Sample], final: dict[str, float],
             health: int) -> dict:
    """The result: counts, the state at the end, the RSS trend and which checks failed."""
    usable_blocks = config.num_kv_blocks - 1
    leaked = round(final["lamina:kv_cache_usage_perc"] * usable_blocks)
    trend = rss_trend(samples, config.duration_s * config.warmup_fraction)
    result = dict(requests=tally.sent, completed=tally.completed, cancelled=tally.cancelled,
                  cancel_too_late=tally.cancel_too_late, errors=dict(tally.errors), error_examples=tally.examples,
                  greedy_mismatches=tally.greedy_mismatches,
                  preemptions=int(final["lamina:num_preemptions_total"]),
                  aborts_counted=int(final.get('lamina:request_success_total{finished_reason="abort"}', 0)),
                  health=health, running=int(final["lamina:num_requests_running"]),
                  waiting=int(final["lamina:num_requests_waiting"]), leaked_blocks=leaked, rss=trend)
    checks = {f"{sum(tally.errors.values())} errors": bool(tally.errors),
              f"/health {health}": health != 200,
              f"{leaked} leaked KV blocks": leaked != 0,
              "requests left running or waiting": bool(result["running"] or result["waiting"]),
              "no preemption: make --num-kv-blocks smaller": not result["preemptions"],
              f"RSS grew {trend['growth_after_warmup']:.1%} after the warm-up":
                  trend["growth_after_warmup"] > config.rss_tolerance}
    failures = [name for name, failed in checks.items() if failed]
    result["failures"] = failures
    return result


def print_table(result: dict) -> None:
    rss = result["rss"]
    rows = [("requests", result["requests"]), ("cancelled", result["cancelled"]),
            ("completed", result["completed"]), ("errors", result["errors"] or 0),
            ("preemptions", result["preemptions"]), ("aborts (server count)", result["aborts_counted"]),
            ("RSS start / warm / end / max", " / ".join(f"{rss[k] / MB:.1f} MB" for k in
                                                         ("start", "warm", "end", "max_after_warmup"))),
            ("RSS growth after warm-up", f"{rss['growth_after_warmup']:+.2%} ({rss['slope_mb_per_min']:+.3f} MB/min)"),
            ("leaked KV blocks", result["leaked_blocks"]), ("/health", result["health"]),
            ("verdict", "PASS" if not result["failures"] else "FAIL: " + "; ".join(result["failures"]))]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def soak(config: SoakConfig) -> dict:
    """Run the whole soak; returns the result (see evaluate)."""
    tally = Tally()
    with tempfile.TemporaryDirectory() as workdir:
        server = Server.start(config, Path(workdir) / "serve.log")
        try:
            monitor = Monitor(server, config.sample_every_s)
            monitor.sample(time.monotonic())  # before the first request
            asyncio.run(_load_and_watch(config, server, tally, monitor))
            final = settle(server)
            health = httpx.get(server.url + "/health", timeout=10).status_code
        finally:
            exit_code = server.stop()
        result = evaluate(config, tally, monitor.samples, final, health)
        result.update(config=asdict(config), server_exit_code=exit_code,
                      samples=[dict(t=s.t, rss=s.rss, kv_usage=s.metrics.get("lamina:kv_cache_usage_perc"),
                                    running=s.metrics.get("lamina:num_requests_running"))
                               for s in monitor.samples])
        if result["failures"]:
            result["server_log_tail"] = server.log_tail()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = SoakConfig()
    parser.add_argument("--model", default=defaults.model, help="model directory (default: the demo model)")
    parser.add_argument("--duration", type=float, default=defaults.duration_s, help="seconds of load (default 600)")
    for name in ("concurrency", "num_kv_blocks", "max_model_len", "max_num_seqs", "seed"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    parser.add_argument("--cancel-fraction", type=float, default=defaults.cancel_fraction)
    parser.add_argument("--sample-every", type=float, default=defaults.sample_every_s, help="seconds")
    parser.add_argument("--result-file", type=Path, default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    config = SoakConfig(model=args.model, duration_s=args.duration, concurrency=args.concurrency,
                        cancel_fraction=args.cancel_fraction, num_kv_blocks=args.num_kv_blocks,
                        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                        sample_every_s=args.sample_every, seed=args.seed)
    result = soak(config)
    print_table(result)
    if args.result_file:
        args.result_file.parent.mkdir(parents=True, exist_ok=True)
        args.result_file.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

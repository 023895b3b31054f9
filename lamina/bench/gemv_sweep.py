"""Batch-1 decode GEMV: cuBLAS (F.linear) against lamina.kernels.gemv over its candidate configs.

    python -m lamina.bench.gemv_sweep [--shapes qwen3-0.6b,llama3-8b] [--result-file out.json]
    python -m lamina.bench.gemv_sweep --rows 2,4,8 --shapes qwen3-0.6b   # M rows: cuBLAS vs the default config
    python -m lamina.bench.gemv_sweep --dry-run     # any machine: interpreter, tiny shapes, 2 configs

For each weight shape (M = 1 unless --rows says otherwise, bf16, random weights ~ N(0, 1/K)) every contender is
checked against F.linear on one copy (max abs diff within bf16 tolerance), then timed as a decode step runs it: a
CUDA graph replays >= 16 calls back to back, the weight copies rotating through > 256 MB so
every call streams its weights from HBM (H200 L2: 50 MB), like a forward pass where each layer has
its own weights. triton.testing.do_bench times the replay (median; it also flushes L2 between
replays); us per call = replay / calls, which includes the in-graph gap between kernels (and the
reduce kernel of split-K configs). GB/s counts weight bytes only; the streaming-read ceiling of the
H200 is 4.63 TB/s. Per shape: cuBLAS, the best gemv config, default_config(N, K), and the launch
floor (an empty one-element fill in the same harness: what any kernel pays per call). Prints a table
last; writes JSON with every config's time with --result-file. At M > 1 (a verify step's rows, a small batch's
decode; lamina.layers.dispatch.gemv_max_rows says how many rows of a weight the GEMV takes) only the default config
is timed against cuBLAS: the question there is which of the two a layer should run.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

CEILING_GBS = 4630.0
SHAPE_SETS = ("demo", "qwen3-0.6b", "llama3-8b")  # lamina's shipped demo model; lamina.bench.offline's shapes
DRY_SHAPES = {"tiny": [("a", 40, 96), ("b", 24, 200)]}
ROTATE_BYTES = 256 << 20  # weight copies per shape: at least this much, at least 2
CALLS = 16  # calls per graph at least (cycling the copies): the replay's own cost spread thin


def linear_shapes(config: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """A decoder layer's linear weights and the LM head of a Llama / Qwen3 HF config: (name, N, K) of weight [N, K]."""
    hidden, inter, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, config["num_key_value_heads"] * head_dim
    return [("qkv", q + 2 * kv, hidden), ("o_proj", hidden, q), ("gate_up", 2 * inter, hidden),
            ("down", hidden, inter), ("lm_head", config["vocab_size"], hidden)]


def shape_set(name: str) -> list[tuple[str, int, int]]:
    """The weight shapes of one of SHAPE_SETS, from the model's config."""
    from lamina import DEMO_MODEL
    from lamina.bench.offline import SHAPES

    config = json.loads((Path(DEMO_MODEL) / "config.json").read_text()) if name == "demo" else SHAPES[name]
    return linear_shapes(config)


def use_interpreter() -> None:
    """Run the Triton kernels on CPU tensors (a dry run): TRITON_INTERPRET=1 and, from the repository root, the
    tests' interpreter fixes; call before anything imports triton."""
    try:
        import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 (+ interpreter fixes) first
    except ImportError:  # not run from the repository root: the env var alone (older numpy is fine)
        os.environ["TRITON_INTERPRET"] = "1"


def _time_per_call(calls: list[Callable[[], Any]], device: str, warmup_ms: int, rep_ms: int) -> float:
    """Microseconds per call: CUDA graph of all calls, replays timed by do_bench. On CPU (dry run)
    one eager pass by the wall clock, meaningless but it exercises the code."""
    for call in calls:  # compile / cuBLAS handles, outside the capture
        call()
    if device == "cpu":
        start = time.perf_counter()
        for call in calls:
            call()
        return (time.perf_counter() - start) * 1e6 / len(calls)
    import triton.testing

    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    del graph
    return ms * 1e3 / len(calls)


def _max_diff(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, bool]:
    diff = (out.float() - ref.float()).abs().max().item()
    return diff, bool(diff <= 2 ** -6 * ref.float().abs().max().item() + 1e-6)  # ~2 bf16 ulps of the scale


def sweep_shape(name: str, n: int, k: int, configs: list[Any], device: str, args: argparse.Namespace,
                m: int = 1) -> dict:
    from lamina.kernels.gemv import default_config, gemv, num_sms

    dtype = torch.bfloat16
    weight_bytes = n * k * dtype.itemsize
    copies = 2 if device == "cpu" else max(2, math.ceil(ROTATE_BYTES / weight_bytes))
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, device=device, generator=g).to(dtype)
    weights = [(torch.randn(n, k, device=device, generator=g) / math.sqrt(k)).to(dtype) for _ in range(copies)]
    ref = F.linear(x, weights[0])

    def gbs(us: float) -> float:
        return weight_bytes / us / 1e3

    order = [weights[i % copies] for i in range(max(copies, CALLS))]
    cublas_us = _time_per_call([lambda w=w: F.linear(x, w) for w in order], device, args.warmup_ms, args.rep_ms)
    flag = torch.zeros(1, device=device)
    floor_us = _time_per_call([flag.zero_] * len(order), device, args.warmup_ms, args.rep_ms)  # empty launches
    default = default_config(n, k, num_sms(x.device))
    results = []
    for cfg in dict.fromkeys([*configs, default]):  # the default too, when it is not a candidate
        row: dict[str, Any] = {"config": cfg.name, **vars(cfg), "default": cfg == default}
        try:
            row["max_abs_diff"], row["ok"] = _max_diff(gemv(x, weights[0], config=cfg), ref)
            us = _time_per_call([lambda w=w, c=cfg: gemv(x, w, config=c) for w in order], device,
                                args.warmup_ms, args.rep_ms)
            row.update(us=us, gbs=gbs(us))
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: record it, keep sweeping
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        results.append(row)
    good = [r for r in results if r.get("ok") and "us" in r]
    best = min(good, key=lambda r: r["us"]) if good else None
    dflt = next(r for r in results if r["default"])
    del weights
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"shape": name, "m": m, "n": n, "k": k, "weight_bytes": weight_bytes, "copies": copies,
            "launch_floor_us": floor_us, "cublas_us": cublas_us, "cublas_gbs": gbs(cublas_us),
            "best": best and {"config": best["config"], "us": best["us"], "gbs": best["gbs"],
                              "speedup": cublas_us / best["us"]},
            "default": {"config": dflt["config"], "us": dflt.get("us"), "gbs": dflt.get("gbs"),
                        "ok": dflt.get("ok")},
            "failed": [r["config"] for r in results if not r.get("ok")], "configs": results}


def _table(rows: list[dict]) -> str:
    header = (f"{'shape':<20} {'M':>2} {'N x K':>13} {'MB':>6} | {'cuBLAS us':>9} {'GB/s':>6} | "
              f"{'best gemv config':<22} {'us':>7} {'GB/s':>6} {'%ceil':>5} {'speedup':>7} | "
              f"{'default us':>10} {'floor us':>8}")
    lines = [header]
    for r in rows:
        b, d = r["best"], r["default"]
        best = (f"{b['config']:<22} {b['us']:>7.2f} {b['gbs']:>6.0f} {100 * b['gbs'] / CEILING_GBS:>5.0f} "
                f"{b['speedup']:>6.2f}x" if b else f"{'(all configs failed)':<22} {'':>7} {'':>6} {'':>5} {'':>7}")
        dflt = f"{d['us']:>10.2f}" if d.get("us") is not None else f"{'failed':>10}"
        lines.append(f"{r['shape']:<20} {r['m']:>2} {r['n']:>6}x{r['k']:<6} {r['weight_bytes'] / 1e6:>6.1f} | "
                     f"{r['cublas_us']:>9.2f} {r['cublas_gbs']:>6.0f} | {best} | {dflt} {r['launch_floor_us']:>8.2f}")
    return "\n".join(lines)


def _row_counts(parser: argparse.ArgumentParser, text: str) -> list[int]:
    from lamina.kernels.gemv import MAX_M  # after use_interpreter: it imports triton

    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        parser.error(f"--rows must be comma-separated integers, got {text!r}")
    if not all(1 <= m <= MAX_M for m in counts):
        parser.error(f"--rows must lie in 1..{MAX_M}, got {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3-0.6b,llama3-8b",
                        help=f"comma-separated, of: {', '.join(SHAPE_SETS)} (demo: lamina's shipped demo model)")
    parser.add_argument("--result-file", help="write the full results as JSON here")
    parser.add_argument("--warmup-ms", type=int, default=5, help="do_bench warm-up per contender")
    parser.add_argument("--rep-ms", type=int, default=25, help="do_bench measuring time per contender")
    parser.add_argument("--rows", default="1", help="comma-separated M values (1..8); M > 1 times the default "
                        "config only")
    parser.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes, 2 configs")
    args = parser.parse_args(argv)
    if args.dry_run:
        use_interpreter()
        sets = DRY_SHAPES
    else:
        unknown = [s for s in args.shapes.split(",") if s not in SHAPE_SETS]
        if unknown:
            parser.error(f"unknown shape set(s) {unknown}; known: {list(SHAPE_SETS)}")
        if not torch.cuda.is_available():
            parser.error("no CUDA device: use --dry-run")
        sets = {s: shape_set(s) for s in args.shapes.split(",")}
    import triton

    from lamina.kernels.gemv import CANDIDATE_CONFIGS, GemvConfig

    row_counts = _row_counts(parser, args.rows)

    device = "cpu" if args.dry_run else "cuda"
    configs = [GemvConfig(8, 64, 1, 4, 1), GemvConfig(4, 64, 2, 2, 1)] if args.dry_run else CANDIDATE_CONFIGS
    start = time.perf_counter()
    rows = []
    for set_name, shapes in sets.items():
        for (name, n, k), m in itertools.product(shapes, row_counts):
            row = sweep_shape(f"{set_name}/{name}", n, k, configs if m == 1 else [], device, args, m)
            rows.append(row)
            b = row["best"]
            print(f"{row['shape']} M={m}: cuBLAS {row['cublas_us']:.2f} us, best {b and b['config']} "
                  f"{b and round(b['us'], 2)} us, failed {row['failed'] or 'none'}", flush=True)
    report = {"workload": "gemv-sweep", "dry_run": args.dry_run, "m": row_counts, "dtype": "bfloat16",
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
              "torch": torch.__version__, "triton": triton.__version__, "ceiling_gbs": CEILING_GBS,
              "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
              "seconds": time.perf_counter() - start, "rows": rows}
    print(_table(rows))
    if args.dry_run:
        print("(dry run: interpreter on CPU, times mean nothing)")
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(r["best"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

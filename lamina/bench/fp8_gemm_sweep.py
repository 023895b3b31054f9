"""FP8 W8A8 GEMM at decode-sized M: torch._scaled_mm (row-wise scales) against lamina.kernels.fp8_gemm.

    python -m lamina.bench.fp8_gemm_sweep [--rows 1,16,32,64,128,256] [--write-table] [--result-file out.json]
    python -m lamina.bench.fp8_gemm_sweep --dry-run     # any machine: interpreter, tiny shapes, 2 configs

For each Llama-3-8B linear shape (the LM head stays bf16 in lamina's fp8 recipe) and each M, every candidate
config is checked against the fp32 reference (lamina.quant.w8a8.fp8_reference), then timed as
lamina.bench.gemv_sweep times: a CUDA graph of calls whose weight copies rotate through > 256 MB (H200 L2: 50 MB),
replays timed by do_bench (median). The peer, torch._scaled_mm as lamina.quant.w8a8.fp8_matmul calls it, runs
in the same harness. Per-token activation quantization is outside both (the same kernel either way).

--write-table: for each shape, [M, the fastest config] where it beat the peer by at least MIN_GAIN, else
[M, null] (the peer), into lamina/kernels/configs/fp8_gemm.json under this device's name (other devices' entries,
and this device's buckets of other M, kept): the table lamina.kernels.fp8_gemm routes by (an entry covers M
from the previous entry's M + 1). The times are of calls replayed in CUDA graphs, as decode steps run; an eager
call adds Triton's launch on the host. Prints a table last; writes JSON with every config's time with
--result-file.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from lamina.kernels.fp8_gemm import Fp8GemmConfig

SHAPES = [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
DRY_SHAPES = [("a", 48, 96), ("b", 40, 160)]
ROWS = (1, 16, 32, 64, 96, 128, 256)  # table buckets; 96 not yet measured (W1 batches shrink from 128)
ROTATE_BYTES = 256 << 20
CALLS = 16
MIN_GAIN = 1.03  # the kernel takes a bucket only when at least this much faster than the peer


def candidates(m: int) -> list[Fp8GemmConfig]:
    """Configs tried at M rows: the batch in one program row (block_m = M rounded up, 16..128), weight tiles of
    32..128 rows, K tiles of 128 / 256, 4 stages; swapped (weight rows on the MMA's M side) at 64 / 128. From 64
    rows on, where the MMAs start to cost as much as the loads, also two warp groups (8 warps) and 3 / 5 stages."""
    from lamina.kernels.fp8_gemm import Fp8GemmConfig

    bm = min(128, max(16, 1 << (m - 1).bit_length()))
    plain = [Fp8GemmConfig(bm, bn, bk) for bn in (32, 64, 128) for bk in (128, 256)]
    swap = [Fp8GemmConfig(bm, bn, bk, swap=True) for bn in (64, 128) for bk in (128, 256)]
    if bm < 64:
        return plain + swap
    wide = [Fp8GemmConfig(bm, bn, 128, swap=sw, num_warps=8, num_stages=st)
            for bn in (64, 128) for sw in (False, True) for st in (3, 5)]
    return plain + swap + wide


def _operands(m: int, n: int, k: int, copies: int, device: str) -> tuple[torch.Tensor, torch.Tensor, list]:
    from lamina.quant.fp8 import fp8_quantize, weight_args
    from lamina.quant.w8a8 import per_token_fp8_reference

    g = torch.Generator(device=device).manual_seed(0)
    x_q, x_scale = per_token_fp8_reference(torch.randn(m, k, device=device, generator=g))
    quantized = (fp8_quantize(torch.randn(n, k, device=device, generator=g), weight_args(0), torch.float32)
                 for _ in range(copies))
    return x_q, x_scale, [(q.q, q.scale) for q in quantized]


def sweep(name: str, n: int, k: int, m: int, configs: list[Fp8GemmConfig], device: str,
          args: argparse.Namespace) -> dict:
    """The peer and every config at M rows of weight shape [N, K]: checked, timed, the fastest picked."""
    from lamina.bench.gemv_sweep import _time_per_call
    from lamina.kernels.fp8_gemm import fp8_gemm
    from lamina.quant.w8a8 import fp8_reference, scaled_mm_rowwise

    copies = 2 if device == "cpu" else max(2, math.ceil(ROTATE_BYTES / (n * k)))
    x_q, x_scale, weights = _operands(m, n, k, copies, device)
    ref = fp8_reference(x_q, x_scale, *weights[0], torch.bfloat16).float()
    order = [weights[i % copies] for i in range(max(copies, CALLS))]

    def timed(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
        return _time_per_call([lambda w=w: fn(*w) for w in order], device, args.warmup_ms, args.rep_ms)

    def ok(out: torch.Tensor) -> bool:
        return bool((out.float() - ref).abs().max() <= 2 ** -6 * ref.abs().max() + 1e-6)

    def kernel(cfg: Fp8GemmConfig) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return lambda w, s: fp8_gemm(x_q, x_scale, w, s, torch.bfloat16, cfg)

    peer = None
    if device == "cuda":
        assert ok(scaled_mm_rowwise(x_q, x_scale, *weights[0])), "torch._scaled_mm disagrees with the reference"
        peer = timed(lambda w, s: scaled_mm_rowwise(x_q, x_scale, w, s))
    first = weights[0]
    rows = [_config_row(c, lambda c: ok(kernel(c)(*first)), lambda c: timed(kernel(c))) for c in configs]
    good = [(r["us"], c) for r, c in zip(rows, configs) if r.get("ok") and "us" in r]
    best_us, best = min(good, key=lambda t: t[0]) if good else (None, None)
    return {"shape": name, "n": n, "k": k, "m": m, "weight_bytes": n * k, "peer_us": peer, "best_us": best_us,
            "best": best and vars(best), "best_name": best and best.name, "configs": rows,
            "failed": [r["config"] for r in rows if not r.get("ok")]}


def _config_row(cfg: Fp8GemmConfig, check: Callable[[Fp8GemmConfig], bool],
                timed: Callable[[Fp8GemmConfig], float]) -> dict[str, Any]:
    """One config's row: checked against the reference, then timed; an error (e.g. out of shared memory) is
    recorded and the sweep goes on."""
    row: dict[str, Any] = {"config": cfg.name}
    try:
        row["ok"] = check(cfg)
        row["us"] = timed(cfg)
    except Exception as exc:  # noqa: BLE001 - any compile or launch failure: a row, not the end of the sweep
        row.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    return row


def table_entries(results: list[dict]) -> dict[str, list]:
    """Per shape "NxK": [[M, config dict or None]], the kernel only where it beat the peer by MIN_GAIN."""
    entries: dict[str, list] = {}
    for r in results:
        wins = r["best_us"] is not None and r["peer_us"] is not None and r["peer_us"] >= MIN_GAIN * r["best_us"]
        entries.setdefault(f"{r['n']}x{r['k']}", []).append([r["m"], r["best"] if wins else None])
    return entries


def merge_entries(old: dict[str, list], new: dict[str, list]) -> dict[str, list]:
    """A device's entries with this run's buckets written over the old ones of the same shape and M (a run over
    some --rows keeps the other buckets)."""
    merged = {shape: dict(map(tuple, buckets)) for shape, buckets in old.items()}
    for shape, buckets in new.items():
        merged.setdefault(shape, {}).update(map(tuple, buckets))
    return {shape: [[m, by_rows[m]] for m in sorted(by_rows)] for shape, by_rows in merged.items()}


def write_table(entries: dict[str, list], device_name: str) -> str:
    from lamina.kernels.fp8_gemm import TABLE_PATH

    tables = json.loads(TABLE_PATH.read_text()) if TABLE_PATH.exists() else {}
    tables[device_name] = merge_entries(tables.get(device_name, {}), entries)
    TABLE_PATH.parent.mkdir(parents=True, exist_ok=True)
    TABLE_PATH.write_text(_dumps(tables))
    return str(TABLE_PATH)


def _dumps(tables: dict[str, dict[str, list]]) -> str:
    """The tables as JSON, one [max rows, config] bucket a line."""
    devices = []
    for device, shapes in tables.items():
        lines = [f'  {json.dumps(shape)}: [\n' + ",\n".join(f"   {json.dumps(b)}" for b in buckets) + "\n  ]"
                 for shape, buckets in shapes.items()]
        devices.append(f" {json.dumps(device)}: {{\n" + ",\n".join(lines) + "\n }")
    return "{\n" + ",\n".join(devices) + "\n}\n"


def _table(results: list[dict]) -> str:
    lines = [f"{'shape':<8} {'N x K':>12} {'M':>4} | {'peer us':>8} {'GB/s':>6} | {'best config':<28} "
             f"{'us':>8} {'GB/s':>6} {'speedup':>7}"]
    for r in results:
        peer, best = r["peer_us"], r["best_us"]
        p = f"{peer:>8.2f} {r['weight_bytes'] / peer / 1e3:>6.0f}" if peer else f"{'-':>8} {'-':>6}"
        b = (f"{r['best_name']:<28} {best:>8.2f} {r['weight_bytes'] / best / 1e3:>6.0f} "
             f"{(peer or best) / best:>6.2f}x" if best else f"{'(all failed)':<28}")
        lines.append(f"{r['shape']:<8} {r['n']:>5}x{r['k']:<6} {r['m']:>4} | {p} | {b}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated M values (table buckets)")
    parser.add_argument("--write-table", action="store_true", help="write the routing table for this device")
    parser.add_argument("--result-file", help="write every config's time as JSON here")
    parser.add_argument("--warmup-ms", type=int, default=5)
    parser.add_argument("--rep-ms", type=int, default=20)
    parser.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes, 2 configs")
    args = parser.parse_args(argv)
    rows = sorted({int(r) for r in args.rows.split(",")})
    if rows[0] < 1:
        parser.error(f"--rows: positive integers, got {args.rows}")
    if args.dry_run:
        from lamina.bench.gemv_sweep import use_interpreter

        use_interpreter()
    elif not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        parser.error("needs a GPU with fp8 (compute capability >= 8.9): use --dry-run elsewhere")
    device = "cpu" if args.dry_run else "cuda"
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    start = time.perf_counter()
    results = []
    for name, n, k in shapes:
        for m in rows:
            configs = candidates(m)[:2] if args.dry_run else candidates(m)
            r = sweep(name, n, k, m, configs, device, args)
            results.append(r)
            print(f"{name} M={m}: peer {r['peer_us'] and round(r['peer_us'], 2)} us, best {r['best_name']} "
                  f"{r['best_us'] and round(r['best_us'], 2)} us, failed {len(r['failed'])}", flush=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    report = {"workload": "fp8-gemm-sweep", "device": name, "torch": torch.__version__,
              "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
              "seconds": time.perf_counter() - start, "min_gain": MIN_GAIN, "results": results,
              "table": table_entries(results)}
    print(_table(results))
    if args.write_table and device == "cuda":
        print(f"table for {name}: {write_table(report['table'], name)}")
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(r["best_us"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The decode W4A16 / W8A16 GEMVs (lamina.kernels.wna16_row, "rowpair"; lamina.kernels.wna16_tc, "tc": its configs
in scripts/wna16_tc_configs.py) against lamina.kernels.wna16_gemv and cuBLAS on bf16, over a grid of configs on
the Llama-3-8B shapes (decode, issue #13), checked and timed.

    python scripts/wna16_gemv_variants.py             # CUDA: the Llama-3-8B shapes, int4 g128 and int8 per channel
    python scripts/wna16_gemv_variants.py --quick     # CUDA: one config family
    python scripts/wna16_gemv_variants.py --tiny      # any machine: every config through the interpreter (CPU)
    python scripts/wna16_gemv_variants.py --sass      # any machine: compile for sm_90a ahead of time, count SASS
    python scripts/wna16_gemv_variants.py --rows 4    # 1..16 rows of x (rowpair up to 4; default 1)
    python scripts/wna16_gemv_variants.py --configs n4-w1-kw128-pf n2-w1-kw128-pf   # these configs, K split as
                                                      # wna16_row.auto_split does (or -s<split> in the name)
    python scripts/wna16_gemv_variants.py --variants tc --tc-configs t2-c2-pf t1-c2-s8-pf   # the same for tc

Why wna16_gemv is slow at one row: the GEMV should be a pure weight stream (H200 ~4.6 TB/s: int4 g128 is 4.2
bytes a 32-bit word with its scales, ~1.1e12 words/s), but the K loop of its default config (n4-kw512-w4,
sm_90a SASS, `--sass`) issues ~54 instructions per word, twice what 132 SMs can issue at that rate (~3.3e13
thread-instructions/s): a shared-memory layout conversion of x every tile, an integer division for the group
index, an FADD per weight on top of its LOP3 and FFMA. wna16_row issues 24-27 per int4 word, 12.0 per int8 word
(15.5 without PRMT; its module docstring has the design).

Two other designs were swept against it on 2026-12-02 and lost (benchmarks/results/2026-12-02-h200-gemv-variants.json;
their code is in this script's history, commit 0c91c3e): "kmajor", a GemLite-style [K/8, N] repacked layout with
lanes along N (~24 SASS instructions per word; int4 qkv 10.5 us against rowpair's 8.3, lm_head 94.6 against 83.8),
and "tc", tensor cores through tl.dot with a Marlin-style unpack into packed bf16 operands (~14 per word, but the
operand staged through shared memory: qkv 14.0 us, lm_head 197.3).

Check: each config's output against an fp32 reference (w = (q - 8 - z) * s in fp32, x @ w.T in fp32): every
output within 2^-8 of itself (bf16 rounding) + 2^-12 of the largest. Timing: CUDA graphs of calls rotating
weight copies through > 256 MB (lamina.bench.gemv_sweep._time_per_call, do_bench median), like
lamina.bench.quant_speed; GB/s counts words + scales + zero points. A config that fails (compile error, out of
resources, wrong answer) is recorded and skipped; no new config starts after --budget-s. JSON:
$OUT/gemv-variants.json ($OUT default ./out); table printed last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

if "--tiny" in sys.argv:
    import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 (+ interpreter fixes) before triton

import triton  # noqa: E402

from lamina.kernels.wna16_row import WNA16RowConfig, wna16_row_gemv  # noqa: E402
from wna16_gemv_sass import describe_error, sass_report  # noqa: E402 - scripts/wna16_gemv_sass.py, beside this
from wna16_tc_configs import tc_configs, tc_gemv, tc_takes  # noqa: E402 - scripts/wna16_tc_configs.py, beside this


def _interpreter_round_to_nearest() -> None:
    """The interpreter truncates float32 -> bf16 casts (the GPU rounds to nearest even): round like the GPU, so
    --tiny checks the kernels to the tolerance the GPU run uses (tests/kernels/conftest.py's fixture)."""
    from triton.runtime import interpreter

    from tests.kernels.conftest import rounding_cast_impl

    interpreter.InterpreterBuilder.cast_impl = rounding_cast_impl(interpreter.InterpreterBuilder.cast_impl)


if "--tiny" in sys.argv:
    _interpreter_round_to_nearest()

TOLERANCE = (2 ** -8, 2 ** -12)  # |out - ref| <= 2^-8 |ref| (bf16 rounding) + 2^-12 max |ref|


# ---------------------------------------------------------------------------------------------------------------
# Variant rowpair: lamina.kernels.wna16_row
# ---------------------------------------------------------------------------------------------------------------
def _row(block_n: int, num_warps: int = 1, reps: int = 1, split: int = 1, prefetch: bool = True) -> WNA16RowConfig:
    """A wna16_row config with `reps` 16-byte chunks per thread and row per tile."""
    return WNA16RowConfig(block_n, num_warps, 128 * num_warps * reps, split, prefetch)


def rowpair_gemv(x: torch.Tensor, op: dict[str, Any], cfg: WNA16RowConfig) -> torch.Tensor:
    return wna16_row_gemv(x, op["words"], op["scale"], op["zero"], None, op["bits"], op["group_size"],
                          op.get("xor", 0), config=cfg)


# ---------------------------------------------------------------------------------------------------------------
# Harness
# ---------------------------------------------------------------------------------------------------------------
SHAPES = [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096)]  # Llama-3-8B, weight [N, K]
QUANTS = {"int4": (4, 128, False), "int8": (8, None, True)}  # bits, group size (None: channel), symmetric
TINY_SHAPES = [("tiny-a", 40, 384), ("tiny-b", 76, 640)]
TINY_QUANTS = {"int4": (4, 128, False), "int4-sym": (4, 128, True), "int4-g32": (4, 32, False),
               "int4-ch": (4, None, False), "int8": (8, None, True), "int8-g64": (8, 64, False)}
SM_COUNT = 132  # H200; replaced by the device's count on CUDA
WARPS_PER_SM = 16  # the split heuristic aims at about this many resident warps


def reference(x: torch.Tensor, op: dict[str, Any]) -> torch.Tensor:
    """fp32: (q - z) * s per group, x @ w.T; rows in chunks (lm_head's fp32 weight would be 2 GB at once)."""
    from lamina.quant.packing import unpack_int32

    words, scale, zero, bits = op["words"], op["scale"].float(), op["zero"], op["bits"]
    k = x.shape[1]
    out = torch.empty((x.shape[0], words.shape[0]), dtype=torch.float32, device=x.device)
    for r in range(0, words.shape[0], 8192):
        q = unpack_int32(words[r:r + 8192], bits, k).float()
        g = scale.shape[1]
        q = q.view(q.shape[0], g, k // g)
        if zero is not None:
            q = q - zero[r:r + 8192].float()[:, :, None]
        out[:, r:r + 8192] = x.float() @ (q * scale[r:r + 8192, :, None]).view(q.shape[0], k).T
    return out


def check(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float]:
    """Within bf16 rounding of each output (2^-8 relative) plus 2^-12 of the largest; and the max error / max."""
    diff = (out.float() - ref).abs()
    top = ref.abs().max().item()
    ok = bool((diff <= TOLERANCE[0] * ref.abs() + TOLERANCE[1] * top + 1e-6).all()) and bool(torch.isfinite(out).all())
    return ok, diff.max().item() / max(top, 1e-30)


def _splits(blocks: int, warps: int, max_split: int, wide: bool) -> list[int]:
    """Split counts: the power of two s giving about WARPS_PER_SM resident warps per SM (at most max_split), and
    2 s too when `wide` (the first configs of a variant)."""
    want = SM_COUNT * WARPS_PER_SM / (warps * blocks)
    s = 1
    while s * 2 <= want and s * 2 <= max_split:
        s *= 2
    return [s, 2 * s] if wide and 2 * s <= max_split else [s]


def _sweep(base: list[Any], blocks: Callable[[Any], int], max_split: Callable[[Any], int], quick: bool,
           wide: int = 2) -> list[Any]:
    """Each base config at its split count(s): the first `wide` at two, the rest at one; --quick: the first only."""
    out = []
    for i, cfg in enumerate(base[:1] if quick else base):
        for sp in _splits(blocks(cfg), cfg.num_warps, max_split(cfg), i < wide and not quick):
            out.append(replace(cfg, split=sp))
    return out


@dataclass
class Variant:
    name: str
    run: Callable[[torch.Tensor, dict[str, Any], Any], torch.Tensor]
    configs: Callable[[int, int, dict[str, Any], bool], list[Any]]  # (n, k, op, quick) -> configs
    takes: Callable[[dict[str, Any], int, int], bool] = lambda op, k, rows: True  # (op, K, rows of x)
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # one-time repack of a weight copy


CONFIG_NAME = re.compile(r"n(\d+)-w(\d+)-kw(\d+)(?:-s(\d+))?(-pf)?$")
NAMED_CONFIGS: list[str] = []  # --configs: these instead of the sweep


def parse_config(name: str, n: int, kw: int) -> WNA16RowConfig:
    """A config from its name, n{rows}-w{warps}-kw{words}[-s{split}][-pf]; no -s: auto_split's."""
    from lamina.kernels.wna16_row import auto_split

    match = CONFIG_NAME.match(name)
    if not match:
        raise SystemExit(f"--configs: {name!r} is not n<rows>-w<warps>-kw<words>[-s<split>][-pf]")
    block_n, warps, block_kw, split, pf = match.groups()
    cfg = WNA16RowConfig(int(block_n), int(warps), int(block_kw), int(split or 1), bool(pf))
    return cfg if split else auto_split(cfg, n, kw, SM_COUNT)


def _rowpair_configs(n: int, k: int, op: dict[str, Any], quick: bool, tiny: bool = False) -> list[WNA16RowConfig]:
    if tiny:
        return [_row(4), _row(8, split=3, prefetch=False), _row(16, 2, split=2),
                _row(2, 1, reps=2, split=2)]
    kw = k * op["bits"] // 32
    if NAMED_CONFIGS:
        return [parse_config(name, n, kw) for name in NAMED_CONFIGS]
    base = [_row(8), _row(16), _row(8, prefetch=False), _row(4),
            _row(8, 2), _row(8, 4, prefetch=False)]
    return _sweep(base, lambda c: triton.cdiv(n, c.block_n), lambda c: triton.cdiv(kw, c.block_kw), quick)


VARIANTS = [Variant("rowpair", rowpair_gemv, _rowpair_configs, lambda op, k, rows: rows <= 4),
            Variant("tc", tc_gemv, lambda n, k, op, quick, tiny=False: tc_configs(n, k, op, quick, tiny, SM_COUNT,
                                                                                 NAMED_TC_CONFIGS), tc_takes)]
NAMED_TC_CONFIGS: list[str] = []  # --tc-configs


def _time(calls: list[Callable[[], Any]], args: argparse.Namespace) -> float | None:
    if args.tiny:
        return None
    from lamina.bench.gemv_sweep import _time_per_call

    return _time_per_call(calls, "cuda", args.warmup_ms, args.rep_ms)


def run_quant(name: str, n: int, k: int, qname: str, quant: tuple, x: torch.Tensor, args: argparse.Namespace,
              gen: torch.Generator, deadline: float) -> dict[str, Any]:
    from lamina.bench.quant_speed import quant_copy

    bits, gs, sym = quant
    first = quant_copy(n, k, bits, gs, sym, args.device, gen)
    count = 1 if args.tiny else max(2, math.ceil(args.rotate_mb * 2 ** 20 / first["bytes"]))
    ops = [first] + [quant_copy(n, k, bits, gs, sym, args.device, gen) for _ in range(count - 1)]
    order = [ops[i % count] for i in range(1 if args.tiny else max(count, 16))]
    ref = reference(x, first)
    row: dict[str, Any] = dict(bytes=first["bytes"], copies=count, variants={})

    def gbs(us: float | None) -> float | None:
        return None if us is None else first["bytes"] / us / 1e3

    if not args.tiny:  # the current kernel, default config
        from lamina.kernels.wna16_gemv import wna16_gemv

        def current(op: dict[str, Any]) -> torch.Tensor:
            return wna16_gemv(x, op["words"], op["scale"], op["zero"], None, op["bits"], op["group_size"])
        try:
            ok, err = check(current(first), ref)
            us = _time([lambda op=op: current(op) for op in order], args)
            row["current"] = dict(ok=ok, err=err, us=us, gbs=gbs(us))
        except Exception as exc:  # noqa: BLE001
            row["current"] = dict(ok=False, error=describe_error(exc))
    for var in VARIANTS:
        if args.variants and var.name not in args.variants:
            continue
        res: dict[str, Any] = {}
        row["variants"][var.name] = res
        if not var.takes(first, k, x.shape[0]):
            res["n/a"] = dict(ok=None, error=f"{var.name} does not take this weight (bits {bits}, group {gs}, K {k}) "
                                             f"or {x.shape[0]} rows of x")
            continue
        try:
            vops = [var.prepare(op) for op in ops] if var.prepare else ops
        except Exception as exc:  # noqa: BLE001
            res["prepare"] = dict(ok=False, error=describe_error(exc))
            continue
        vorder = [vops[i % count] for i in range(len(order))]
        cfgs = var.configs(n, k, first, args.quick, args.tiny) if args.tiny else var.configs(n, k, first, args.quick)
        for cfg in cfgs:
            if time.perf_counter() > deadline:
                res[cfg.name] = dict(ok=None, error="skipped: time budget")
                continue
            try:
                out = var.run(x, vops[0], cfg)
                ok, err = check(out, ref)
                entry: dict[str, Any] = dict(ok=ok, err=err)
                if ok:
                    us = _time([lambda op=op, c=cfg: var.run(x, op, c) for op in vorder], args)
                    entry.update(us=us, gbs=gbs(us))
                res[cfg.name] = entry
            except Exception as exc:  # noqa: BLE001 - compile error, out of resources, ...: record, keep going
                res[cfg.name] = dict(ok=False, error=describe_error(exc))
        if var.prepare:
            del vops
    del ops, order
    return row


def run_shape(name: str, n: int, k: int, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    import torch.nn.functional as F

    gen = torch.Generator(device=args.device).manual_seed(0)
    x = torch.randn(args.rows, k, device=args.device, generator=gen).to(torch.bfloat16)
    row: dict[str, Any] = dict(shape=name, n=n, k=k, quants={})
    if not args.tiny:
        copies = max(2, math.ceil(args.rotate_mb * 2 ** 20 / (n * k * 2)))
        weights = [(torch.randn(n, k, device=args.device, generator=gen) / math.sqrt(k)).to(torch.bfloat16)
                   for _ in range(copies)]
        order = [weights[i % copies] for i in range(max(copies, 16))]
        row["cublas_us"] = _time([lambda w=w: F.linear(x, w) for w in order], args)
        row["cublas_gbs"] = n * k * 2 / row["cublas_us"] / 1e3
        del weights, order
    for qname, quant in (TINY_QUANTS if args.tiny else QUANTS).items():
        if args.quants and qname not in args.quants:
            continue
        row["quants"][qname] = run_quant(name, n, k, qname, quant, x, args, gen, deadline)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return row


def best(res: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    good = [(c, e) for c, e in res.items() if e.get("ok") and e.get("us") is not None]
    return min(good, key=lambda ce: ce[1]["us"]) if good else None


def table(rows: list[dict[str, Any]], tiny: bool) -> str:
    names = [v.name for v in VARIANTS]
    if tiny:
        lines = [f"{'shape':<8} {'quant':<9} " + " ".join(f"{v + ' ok/all':>14}" for v in names) + "  max err"]
        for row in rows:
            for q, r in row["quants"].items():
                cells, errs = [], []
                for v in names:
                    res = r["variants"].get(v, {})
                    runs = [e for e in res.values() if e.get("ok") is not None]
                    cells.append(f"{sum(bool(e['ok']) for e in runs)}/{len(runs)}" if runs else "n/a")
                    errs += [e["err"] for e in runs if "err" in e]
                lines.append(f"{row['shape']:<8} {q:<9} " + " ".join(f"{c:>14}" for c in cells)
                             + f"  {max(errs) if errs else float('nan'):.1e}")
        return "\n".join(lines)
    head = (f"{'shape':<8} {'q':<4} {'MB':>6} | {'cuBLAS':>7} | {'current':>7} {'GB/s':>5} | "
            + " | ".join(f"{v:>7} {'GB/s':>5} {'config':<22}" for v in names) + " | best: x current / x cuBLAS")
    lines = [head]
    for row in rows:
        for q, r in row["quants"].items():
            cur = r.get("current", {})
            cells, bests = [], []
            for v in names:
                res = r["variants"].get(v, {})
                b = best(res)
                if b:
                    bests.append(b[1]["us"])
                    cells.append(f"{b[1]['us']:>7.1f} {b[1]['gbs']:>5.0f} {b[0]:<22}")
                else:
                    cells.append(f"{'-':>7} {'':>5} {('n/a' if 'n/a' in res else '(none ok)'):<22}")
            speed = (f"{cur['us'] / min(bests):.2f}x / {row['cublas_us'] / min(bests):.2f}x"
                     if bests and cur.get("us") else "-")
            lines.append(f"{row['shape']:<8} {q:<4} {r['bytes'] / 1e6:>6.1f} | {row['cublas_us']:>7.1f} | "
                         f"{cur.get('us') or float('nan'):>7.1f} {cur.get('gbs') or float('nan'):>5.0f} | "
                         + " | ".join(cells) + f" | {speed}")
    return "\n".join(lines)


def failures(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for row in rows:
        for q, r in row["quants"].items():
            for v, res in r["variants"].items():
                for c, e in res.items():
                    if e.get("ok") is False:
                        why = e.get("error") or f"wrong answer, max error {e['err']:.2e} of the largest output"
                        out.append(f"{row['shape']}/{q}/{v}/{c}: {why}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, the interpreter, tiny shapes: correctness only")
    parser.add_argument("--quick", action="store_true", help="one config family per variant")
    parser.add_argument("--sass", action="store_true", help="AOT-compile for sm_90a and count SASS (no GPU)")
    parser.add_argument("--variants", nargs="*", help=f"subset of {[v.name for v in VARIANTS]}")
    parser.add_argument("--quants", nargs="*", help="subset of int4 int8")
    parser.add_argument("--shapes", nargs="*", help=f"subset of {[s[0] for s in SHAPES]}")
    parser.add_argument("--budget-s", type=float, default=215.0, help="stop trying new configs after this long")
    parser.add_argument("--rotate-mb", type=float, default=256.0, help="weight copies per shape: at least this much")
    parser.add_argument("--warmup-ms", type=int, default=3)
    parser.add_argument("--rep-ms", type=int, default=15)
    parser.add_argument("--rows", type=int, default=1, choices=range(1, 17), help="rows of x (1..16; rowpair 1..4)")
    parser.add_argument("--configs", nargs="*", default=[],
                        help="wna16_row configs by name instead of the sweep, e.g. n4-w1-kw256-pf (no -s: auto_split)")
    parser.add_argument("--tc-configs", nargs="*", default=[],
                        help="wna16_tc configs by name instead of the sweep, e.g. t2-c2-pf (no -s: auto_split)")
    args = parser.parse_args(argv)
    NAMED_CONFIGS[:] = args.configs
    NAMED_TC_CONFIGS[:] = args.tc_configs
    if args.sass:
        return sass_report()
    global SM_COUNT
    args.device = "cpu" if args.tiny else "cuda"
    if not args.tiny:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: use --tiny (interpreter) or --sass")
        SM_COUNT = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = TINY_SHAPES if args.tiny else [s for s in SHAPES if not args.shapes or s[0] in args.shapes]
    out_dir = Path(os.environ.get("OUT") or "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    deadline = start + (float("inf") if args.tiny else args.budget_s)
    report: dict[str, Any] = dict(workload="wna16-gemv-variants", tiny=args.tiny, x_rows=args.rows,
                                  command=" ".join(sys.argv),
                                  date=time.strftime("%Y-%m-%d %H:%M:%S"), torch=torch.__version__,
                                  triton=triton.__version__,
                                  device=torch.cuda.get_device_name() if not args.tiny else "cpu (interpreter)",
                                  rows=[])
    for name, n, k in shapes:
        report["rows"].append(run_shape(name, n, k, args, deadline))
        report["seconds"] = time.perf_counter() - start
        (out_dir / "gemv-variants.json").write_text(json.dumps(report, indent=1))
        print(f"{name}: done at {report['seconds']:.0f} s", flush=True)
    fails = failures(report["rows"])
    for line in fails:
        print("FAILED", line)
    print(table(report["rows"], args.tiny))
    if args.tiny:
        print("(interpreter on CPU: correctness only)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

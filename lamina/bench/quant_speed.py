"""Weight-only quantization speed (issue #13): the W4A16 / W8A16 Triton kernels against bf16, on Llama-3-8B shapes.

    python -m lamina.bench.quant_speed               # one GPU, ~5 minutes; JSON to $OUT (default ./out)
    python -m lamina.bench.quant_speed --tiny        # any machine: interpreter, tiny shapes, a tiny model

(a) Kernels, 1..4 and 8 rows of x (bf16), each Llama-3-8B linear shape: cuBLAS (F.linear) and lamina's bf16 GEMV on
    a bf16 weight, and on random packed words the int4 (g128, asymmetric: rtn4's scheme) and int8 (per channel,
    symmetric: the int8 recipe's) kernel that the engine runs at that many rows (lamina.quant.wna16.decode_kernel:
    wna16_row or wna16_tc; the table names it). Timed as lamina.bench.gemv_sweep times: a CUDA
    graph of >= 16 calls rotating weight copies through > 256 MB (every call streams from HBM), do_bench median.
    GB/s counts the bytes a call must read (weights, scales, zero points). Each quantized kernel is checked
    against the reference path (dequantize + F.linear) first. Also: wna16_gemv's int4 candidate configs at 1 row
    (best vs default), and the int4 GEMM against cuBLAS bf16 at prefill sizes.
(b) Engine: greedy decode tok/s of a Llama-3-8B-shape model on dummy weights (load_format="dummy" draws valid
    random integers and scales for quantized layers), bf16 vs int4 (rtn4, g128) vs int8, every linear layer
    quantized, the LM head included, at batch 1 and BATCH requests at once (every linear layer then multiplies
    BATCH rows: wna16_tc's range); the memory of each model's parameters.
Bars: int4 >= 2.5x bf16 decode tok/s (target 3.2x), int8 >= 1.6x, int4 weights < 5.5 GB.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SHAPES = [("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096)]
TINY_SHAPES = [("tiny", 24, 256)]
QUANT = {"int4": (4, 128, False), "int8": (8, None, True)}  # bits, group size (None: channel), symmetric
GEMM_ROWS = (16, 256, 2048)
BATCH = 8
ROTATE_BYTES = 256 << 20
CALLS = 16
BARS = {"int4": 2.5, "int8": 1.6}
INT4_MAX_GB = 5.5


def _time(calls: list, device: str, args: argparse.Namespace) -> float:
    from lamina.bench.gemv_sweep import _time_per_call

    return _time_per_call(calls, device, args.warmup_ms, args.rep_ms)


def quant_copy(n: int, k: int, bits: int, group_size: int | None, symmetric: bool, device: str,
               gen: torch.Generator) -> dict[str, Any]:
    """Random packed words (uniform values), positive scales, zero points: one weight's kernel operands."""
    groups = 1 if group_size is None else k // group_size
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    words = torch.randint(-(1 << 31), 1 << 31, (n, k * bits // 32), generator=gen, device=device,
                          dtype=torch.int64).to(torch.int32)
    scale = ((torch.rand(n, groups, generator=gen, device=device) + 0.5) * 0.02 * 12 ** 0.5 / (1 << bits))
    zero = None if symmetric else torch.randint(lo, hi + 1, (n, groups), generator=gen, device=device,
                                                dtype=torch.int64).to(torch.int8)
    op = dict(words=words, scale=scale.to(torch.bfloat16), zero=zero, bits=bits, group_size=group_size)
    op["bytes"] = sum(t.numel() * t.element_size() for t in (words, op["scale"], zero) if t is not None)
    return op


def reference(x: torch.Tensor, op: dict[str, Any], k: int) -> torch.Tensor:
    from lamina.quant.packing import unpack_int32
    from lamina.quant.wna16 import dequantize

    return F.linear(x, dequantize(unpack_int32(op["words"], op["bits"], k), op["scale"], op["zero"]))


def _close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    return bool((out.float() - ref.float()).abs().max() <= 2 ** -6 * ref.float().abs().max() + 1e-6)


def kernel_shape(name: str, n: int, k: int, device: str, args: argparse.Namespace) -> dict[str, Any]:
    from lamina.kernels.gemv import MAX_M as GEMV_MAX_M, gemv
    from lamina.kernels.wna16_gemm import wna16_gemm, wna16_matmul
    from lamina.kernels.wna16_gemv import CANDIDATE_CONFIGS, default_config, num_sms, wna16_gemv
    from lamina.quant.wna16 import decode_kernel

    gen = torch.Generator(device=device).manual_seed(0)
    bf16_bytes = n * k * 2
    copies = 1 if device == "cpu" else max(2, math.ceil(ROTATE_BYTES / bf16_bytes))  # CPU: the code, not times
    weights = [(torch.randn(n, k, device=device, generator=gen) / math.sqrt(k)).to(torch.bfloat16)
               for _ in range(copies)]
    calls = 1 if device == "cpu" else max(copies, CALLS)
    order = [weights[i % copies] for i in range(calls)]
    row: dict[str, Any] = dict(shape=name, n=n, k=k, bf16_bytes=bf16_bytes, rows={})
    quant = {}
    for qname, (bits, gs, sym) in QUANT.items():
        first = quant_copy(n, k, bits, gs, sym, device, gen)
        count = 1 if device == "cpu" else max(2, math.ceil(ROTATE_BYTES / first["bytes"]))
        ops = [first] + [quant_copy(n, k, bits, gs, sym, device, gen) for _ in range(count - 1)]
        quant[qname] = [ops[i % count] for i in range(1 if device == "cpu" else max(count, CALLS))]
        row[f"{qname}_bytes"] = first["bytes"]

    def q_call(fn: Any, x: torch.Tensor, op: dict[str, Any], **kw: Any) -> torch.Tensor:
        return fn(x, op["words"], op["scale"], op["zero"], None, op["bits"], op["group_size"], **kw)

    for m in args.rows:
        x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
        r: dict[str, Any] = dict(cublas_us=_time([lambda w=w: F.linear(x, w) for w in order], device, args),
                                 gemv_bf16_us=None)  # lamina's bf16 GEMV takes up to its MAX_M rows
        if m <= GEMV_MAX_M:
            r["gemv_bf16_us"] = _time([lambda w=w: gemv(x, w) for w in order], device, args)
        for qname, ops in quant.items():
            fn = decode_kernel(m, n, k, ops[0]["bits"], ops[0]["group_size"], x.dtype)
            ok = _close(q_call(fn, x, ops[0]), reference(x, ops[0], k))
            us = _time([lambda op=op: q_call(fn, x, op) for op in ops], device, args)
            r.update({f"{qname}_us": us, f"{qname}_gbs": row[f"{qname}_bytes"] / us / 1e3, f"{qname}_ok": ok,
                      f"{qname}_kernel": getattr(fn, "func", fn).__name__})
        best_bf16 = min(r["cublas_us"], r["gemv_bf16_us"] or math.inf)
        r.update(cublas_gbs=bf16_bytes / r["cublas_us"] / 1e3, int4_speedup=best_bf16 / r["int4_us"],
                 int8_speedup=best_bf16 / r["int8_us"])
        row["rows"][m] = r
    x = torch.randn(1, k, device=device, generator=gen).to(torch.bfloat16)
    default = default_config(n, k, 4, num_sms(torch.device(device)))
    sweep = {}
    late = time.monotonic() > args.deadline  # past the time budget: the default config and no GEMM
    candidates = [] if args.tiny or args.no_sweep or late else CANDIDATE_CONFIGS
    for cfg in dict.fromkeys([default, *candidates]):
        try:
            ok = _close(q_call(wna16_gemv, x, quant["int4"][0], config=cfg), reference(x, quant["int4"][0], k))
            sweep[cfg.name] = dict(ok=ok, us=_time([lambda op=op, c=cfg: q_call(wna16_gemv, x, op, config=c)
                                                    for op in quant["int4"]], device, args))
        except Exception as exc:  # noqa: BLE001 - e.g. out of registers: record it, keep sweeping
            sweep[cfg.name] = dict(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    good = {c: s for c, s in sweep.items() if s.get("ok")}
    best = min(good, key=lambda c: good[c]["us"]) if good else None
    row["int4_configs"] = dict(default=default.name, best=best, results=sweep)
    row["gemm"] = {}
    for m in () if late else args.gemm_rows:
        x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
        ops = quant["int4"][:4]
        ref = reference(x, ops[0], k)
        ok = _close(q_call(wna16_gemm, x, ops[0]), ref) and _close(q_call(wna16_matmul, x, ops[0]), ref)
        row["gemm"][m] = dict(ok=ok, cublas_us=_time([lambda w=w: F.linear(x, w) for w in order[:4]], device, args),
                              int4_us=_time([lambda op=op: q_call(wna16_gemm, x, op) for op in ops], device, args),
                              dequant_us=_time([lambda op=op: q_call(wna16_matmul, x, op) for op in ops], device, args))
    return row


def quantized_config(shape: str, directory: Path, scheme: str | None, group_size: int = 128) -> Path:
    """config.json of `shape` (lamina.bench.offline), with a compressed-tensors quantization_config for
    every linear layer, the LM head included, when `scheme` is "int4" (rtn4, group_size) or "int8"."""
    from lamina.bench.offline import write_config
    from lamina.quant import int8, rtn4
    from lamina.quant.compressed_tensors import config_dict

    path = write_config(shape, directory)
    if scheme is not None:
        args = rtn4.weight_args(group_size) if scheme == "int4" else int8.weight_args(0)
        config = json.loads(path.read_text())
        config["quantization_config"] = config_dict(args, ignore=[])
        path.write_text(json.dumps(config, indent=1))
    return path


def engine_decode(scheme: str | None, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from lamina import LLM
    from lamina.bench.offline import batch_decode_timing, decode_timing, release_memory

    directory = workdir / (scheme or "bf16")
    directory.mkdir()
    path = quantized_config(args.shape, directory, scheme, args.group_size)
    release_memory()
    start = time.perf_counter()
    llm = LLM(model=str(path), load_format="dummy", skip_tokenizer_init=True, dtype=args.dtype, device=args.device,
              max_model_len=args.max_model_len, max_num_seqs=BATCH, max_num_batched_tokens=args.max_model_len,
              kv_cache_memory_bytes=args.kv_bytes, enable_pdl=args.enable_pdl)
    startup = time.perf_counter() - start
    prompt = [(7 * i + 3) % 10000 for i in range(args.prompt_len)]
    decode_timing(llm, prompt, 2)  # warm-up
    first, last, produced = decode_timing(llm, prompt, args.new_tokens)
    batch_first, batch_last, _ = batch_decode_timing(llm, [[(t + i) % 10000 for t in prompt] for i in range(BATCH)],
                                                     args.new_tokens)
    model = llm.engine.executor.worker.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" in n)
    result = dict(scheme=scheme or "bf16", tok_per_s=(produced - 1) / (last - first), tokens=produced,
                  batch=BATCH, batch_tok_per_s=BATCH * (args.new_tokens - 1) / (batch_last - batch_first),
                  weight_gb=weight_bytes / 1e9, streamed_gb=(weight_bytes - embed) / 1e9, startup_s=startup,
                  cuda_graphs=llm.engine.executor.worker.runner.graphs is not None)
    del llm, model
    release_memory()
    return result


def table(report: dict[str, Any]) -> str:
    lines = []
    if report.get("kernels"):
        lines.append(f"{'shape':<8} {'rows':>4} | {'cuBLAS us':>9} {'GB/s':>6} {'gemv us':>8} | {'int4 us':>8} "
                     f"{'GB/s':>6} {'x bf16':>6} | {'int8 us':>8} {'GB/s':>6} {'x bf16':>6} | ok")
        for row in report["kernels"]:
            for m, r in row["rows"].items():
                lines.append(f"{row['shape']:<8} {m:>4} | {r['cublas_us']:>9.1f} {r['cublas_gbs']:>6.0f} "
                             f"{r['gemv_bf16_us'] or math.nan:>8.1f} | {r['int4_us']:>8.1f} {r['int4_gbs']:>6.0f} "
                             f"{r['int4_speedup']:>5.2f}x | {r['int8_us']:>8.1f} {r['int8_gbs']:>6.0f} "
                             f"{r['int8_speedup']:>5.2f}x | {r['int4_ok'] and r['int8_ok']} {r['int4_kernel']}")
        for row in report["kernels"]:
            c = row["int4_configs"]
            best = c["results"].get(c["best"] or "", {})
            gemm = ", ".join(f"M={m}: int4 {g['int4_us']:.0f} / dequant+cuBLAS {g['dequant_us']:.0f} "
                             f"vs {g['cublas_us']:.0f} us"
                             f"{'' if g['ok'] else ' WRONG'}" for m, g in row["gemm"].items())
            lines.append(f"{row['shape']:<8} int4 wna16_gemv default {c['default']} "
                         f"{c['results'][c['default']].get('us', float('nan')):.1f} us, best {c['best']} "
                         f"{best.get('us', float('nan')):.1f} us | GEMM {gemm}")
    engine = report.get("engine")
    if engine:
        base = engine[0]["tok_per_s"]
        batch_base = engine[0]["batch_tok_per_s"]
        lines.append(f"{'engine':<8} | {'tok/s':>8} {'x bf16':>7} {'bar':>5} | {f'batch {BATCH} tok/s':>14} "
                     f"{'x bf16':>7} | {'weights GB':>10} {'streamed GB':>11}")
        for e in engine:
            bar = BARS.get(e["scheme"])
            verdict = "" if bar is None else ("PASS" if e["tok_per_s"] / base >= bar else "FAIL")
            lines.append(f"{e['scheme']:<8} | {e['tok_per_s']:>8.1f} {e['tok_per_s'] / base:>6.2f}x "
                         f"{verdict:>5} | {e['batch_tok_per_s']:>14.1f} {e['batch_tok_per_s'] / batch_base:>6.2f}x | "
                         f"{e['weight_gb']:>10.2f} {e['streamed_gb']:>11.2f}")
        int4 = next((e for e in engine if e["scheme"] == "int4"), None)
        if int4 is not None:
            lines.append(f"int4 weights {int4['weight_gb']:.2f} GB: "
                         f"{'PASS' if int4['weight_gb'] < INT4_MAX_GB else 'FAIL'} (< {INT4_MAX_GB} GB)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes and model")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--no-sweep", action="store_true", help="kernels: the int4 GEMV's default config only")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="past this many seconds, the remaining shapes skip the config sweep and the GEMM")
    parser.add_argument("--new-tokens", type=int, default=256, help="engine: greedy tokens per timed request")
    parser.add_argument("--no-enable-pdl", dest="enable_pdl", action="store_false",
                        help="engine: the engine argument enable_pdl=False (kernels launched without PDL)")
    parser.add_argument("--warmup-ms", type=int, default=5)
    parser.add_argument("--rep-ms", type=int, default=25)
    args = parser.parse_args(argv)
    args.deadline = time.monotonic() + args.budget_s
    args.rows, args.gemm_rows, args.shapes = (1, 2, 3, 4, 8), GEMM_ROWS, SHAPES
    args.shape, args.dtype, args.device, args.kv_bytes = "llama3-8b", "bfloat16", "cuda", 2 << 30
    args.prompt_len, args.max_model_len, args.group_size = 128, 2048, 128
    if args.tiny:
        args.rows, args.gemm_rows, args.shapes = (1, 3, 8), (9,), TINY_SHAPES
        args.shape, args.dtype, args.device, args.kv_bytes = "tiny", "float32", "cpu", 1 << 24
        args.prompt_len, args.max_model_len, args.new_tokens = 8, 128, min(args.new_tokens, 6)
        args.group_size = 32  # the tiny model's hidden size is 64
    elif not torch.cuda.is_available():
        parser.error("no CUDA device: use --tiny")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tiny:
        from lamina.bench.gemv_sweep import use_interpreter

        use_interpreter()
    start = time.perf_counter()
    report: dict[str, Any] = dict(workload="quant-speed", tiny=args.tiny, command=" ".join(sys.argv),
                                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                  device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                                  torch=torch.__version__, kernels=[], engine=[])
    out_dir = Path(os.environ.get("OUT") or "out")
    out_dir.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every step: a run cut short keeps what it measured
        report["seconds"] = time.perf_counter() - start
        (out_dir / "quant_speed.json").write_text(json.dumps(report, indent=1))

    if not args.skip_engine:  # first: the bars are engine-level
        with tempfile.TemporaryDirectory() as workdir:
            for scheme in (None, "int4", "int8"):
                report["engine"].append(engine_decode(scheme, args, Path(workdir)))
                save()
                print(f"engine {scheme or 'bf16'}: {report['engine'][-1]['tok_per_s']:.1f} tok/s at "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
    if not args.skip_kernels:
        for name, n, k in args.shapes:
            report["kernels"].append(kernel_shape(name, n, k, args.device, args))
            save()
            print(f"kernels {name}: done at {time.perf_counter() - start:.0f} s", flush=True)
    save()
    print(table(report))
    if args.tiny:
        print("(tiny: interpreter on CPU, times mean nothing)")
    wrong = [row["shape"] for row in report["kernels"] if not all(r["int4_ok"] and r["int8_ok"]
                                                                  for r in row["rows"].values())]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

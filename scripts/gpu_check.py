"""GPU check of the Triton attention kernels: correctness at real shapes, then W5 timings.

    python scripts/gpu_check.py             # on the H200: checks + W5 (+ a small tile/split sweep)
    python scripts/gpu_check.py --quick     # checks + W5 with the shipped configs only
    python scripts/gpu_check.py --dry-run   # any machine: tiny checks under the interpreter, W5 shapes
    python scripts/gpu_check.py --engine    # on the H200 (< 4 min): CUDA graphs vs eager, W2 qwen3-0.6b
    python scripts/gpu_check.py --engine --dry-run   # the same on CPU (EagerGraph stands in, tiny W2)

1. Every kernel (store, prefill, decode, the backend on a mixed batch) against torch_ref on random
   inputs at real shapes (head_dim 64..256, GQA 1..8, bf16 / fp16 / fp32, chunk offsets, 1 + k
   verification, several splits), with NaN-poisoned caches and outputs (tests/kernels/cases.py);
   the fused small ops and the GEMV against the layers' PyTorch path at Qwen3-0.6B / Llama-3-8B shapes, and
   the greedy argmax against torch.argmax at their vocabularies.
2. W5 (see ../shared/BENCHMARKS.md), timed with triton.testing.do_bench (median):
   prefill: causal, head_dim 128, 32 q / 8 KV heads, 16k tokens in sequences of 512..8192 plus
   ragged batches; TFLOP/s = 2 * H * D * sum(n * (n + 1)) / s, against SDPA (flash, K/V expanded to
   32 heads) on the same sequences. decode: batch 64, context 1k..32k, block 16, shuffled blocks;
   bytes = K + V read, against the 4.63 TB/s streaming-read ceiling and SDPA on a contiguous cache.
3. --engine (scripts/gpu_check_engine.py; instead of 1 and 2): greedy tokens of the demo model (bf16,
   triton backend) with CUDA graphs against enforce_eager, the first 32 tokens of 16 prompts (bf16 can flip
   near-ties: reports how many match exactly); then W2 qwen3-0.6b decode tok/s with graphs and with
   enforce_eager.
Prints a table last; writes everything to $OUT/gpu_check.json when OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

H, KV, D, BLOCK = 32, 8, 128, 16
CEILING_TBS = 4.63
PREFILL_BATCHES = {"32x512": [512] * 32, "4x4096": [4096] * 4, "2x8192": [8192] * 2,
                   "ragged-16k": [8192, 3000, 2048, 1500, 1000, 512, 100, 12, 20],
                   "short-ragged": [17, 300, 129, 64, 1000, 77, 511, 9]}
DECODE_CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768]
DECODE_BATCH = 64
PREFILL_SWEEP = [dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
                 dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),
                 dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=4),
                 dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)]
DECODE_SWEEP = [dict(BLOCK_N=64, num_warps=4, num_stages=3), dict(BLOCK_N=32, num_warps=4, num_stages=4),
                dict(BLOCK_N=128, num_warps=8, num_stages=2), dict(BLOCK_N=64, num_warps=2, num_stages=4)]


def checks(tiny: bool) -> list[dict[str, Any]]:
    """Every correctness check's shapes; `tiny` shrinks lengths (monotonically, so q_len <= seq_len
    still holds) and KV heads (keeping the GQA ratio) for the interpreter."""
    n = (lambda x: x if x <= 40 else 40 + (x - 40) // 64) if tiny else (lambda x: x)
    out = []
    for dt, heads, kv, d in [("bfloat16", 32, 8, 128), ("bfloat16", 16, 8, 64), ("float16", 32, 4, 96),
                             ("float32", 8, 8, 80), ("bfloat16", 8, 1, 256), ("float16", 64, 8, 128)]:
        if tiny:
            heads, kv = heads // kv * min(kv, 2), min(kv, 2)
        for kind, seq_lens, q_lens, splits in [
            ("prefill", [3000, 2048 + 301, 4096 + 17, 33], [3000, 301, 1024 + 17, 33], None),
            ("decode", [8005, 104, 20000, 3, 4096], [1, 4, 4, 1, 4], None),
            ("decode", [8005, 101, 9], [4, 1, 4], 7),
            ("backend", [2000, 1024 + 200, 9000, 40, 8], [2000, 200, 1, 4, 8], None),
        ]:
            out.append(dict(kind=kind, seq_lens=[n(x) for x in seq_lens], q_lens=[n(x) for x in q_lens],
                            splits=splits, dtype=dt, heads=heads, kv=kv, d=d))
    return out


def run_check(spec: dict[str, Any], device: str) -> dict[str, Any]:
    import torch

    from lamina.attention.triton_backend import TritonAttentionBackend
    from lamina.kernels.decode_attention import choose_num_splits, decode_attention
    from lamina.kernels.prefill_attention import prefill_attention
    from tests.kernels.cases import make_case, tolerance

    dtype = getattr(torch, spec["dtype"])
    case = make_case(spec["seq_lens"], spec["q_lens"], spec["heads"], spec["kv"], spec["d"], BLOCK, dtype,
                     seed=len(spec["seq_lens"]), device=device)
    md = case.metadata
    tables = (md.block_tables, md.seq_lens, md.query_start_loc)
    if spec["kind"] == "backend":
        k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()
        out = TritonAttentionBackend().forward(case.q, case.k, case.v, k_cache, v_cache, md, case.scale)
    else:
        k_cache, v_cache = case.stored_caches()
        out = torch.full_like(case.q, float("nan"))
        if spec["kind"] == "prefill":
            prefill_attention(case.q, k_cache, v_cache, out, *tables, md.max_query_len, case.scale)
        else:
            splits = spec["splits"] or choose_num_splits(md.max_seq_len, md.num_seqs, spec["kv"])
            decode_attention(case.q, k_cache, v_cache, out, *tables, md.max_query_len, case.scale, splits)
    ref = case.reference()
    err = (out.float() - ref).abs().max().item()
    try:
        torch.testing.assert_close(out.float(), ref, **tolerance(dtype))
        ok = True
    except AssertionError:
        ok = False
    name = f"{spec['kind']} {spec['dtype']} H{spec['heads']}/KV{spec['kv']} D{spec['d']} q={spec['q_lens']}"
    return dict(name=name, ok=ok and not out.isnan().any().item(), max_abs_err=err, **spec)


def compare(name: str, actual: Any, expected: Any, rel: float = 2e-2) -> dict[str, Any]:
    """A check row: every element written and within `rel` of the expected values' largest magnitude."""
    scale = expected.float().abs().max().item()
    err = (actual.float() - expected.float()).abs().max().item()
    ok = not actual.isnan().any().item() and err <= rel * max(scale, 1e-6)
    return dict(name=name, ok=ok, max_abs_err=err)


def op_checks(device: str) -> list[dict[str, Any]]:
    """The fused small ops and the GEMV at real shapes (Qwen3-0.6B / Llama-3-8B) against the layers'
    PyTorch path on the same device (bf16; fp32 on the interpreter)."""
    import torch

    from lamina.config import KernelChoice
    from lamina.kernels import fused_ops
    from lamina.layers.activation import SiluAndMul
    from lamina.layers.norm import RMSNorm
    from lamina.layers.rotary import RotaryEmbedding

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    reference = KernelChoice(fused_ops=False, gemv=False)  # the layers' PyTorch path, which the kernels must match
    gen = torch.Generator(device).manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=gen, device=device).to(dtype)  # noqa: E731
    rows: list[dict[str, Any]] = []

    def record(name: str, actual: Any, expected: Any, rel: float = 2e-2) -> None:
        rows.append(compare(name, actual, expected, rel))

    tokens = [1, 7] if device == "cuda" else [1, 3]
    for hidden, heads, kv_heads, inter in [(1024, 16, 8, 3072), (4096, 32, 8, 14336)]:
        hidden_run = hidden if device == "cuda" else 64
        norm = RMSNorm(hidden_run, kernels=reference).to(device=device, dtype=dtype)
        norm.weight.data = 1 + 0.1 * randn(hidden_run)
        for t in tokens:
            x, res = randn(t, hidden_run), randn(t, hidden_run)
            ref, ref_res = norm(x, res)
            out, out_res = fused_ops.fused_add_rms_norm(x, res, norm.weight, norm.variance_epsilon)
            record(f"add+rms_norm {t}x{hidden_run}", out, ref)
            record(f"add (residual) {t}x{hidden_run}", out_res, ref_res, rel=0.0)
            d = 128 if device == "cuda" else 16
            nq, nk = (heads, kv_heads) if device == "cuda" else (4, 2)
            rope = RotaryEmbedding(d, 1e6, 8192, kernels=reference).to(device)
            qk = randn(t, (nq + nk) * d)
            q, k = qk[:, :nq * d], qk[:, nq * d:]
            pos = torch.randint(0, 8192, (t,), generator=gen, device=device)
            ref_q, ref_k = rope(pos, q.clone(), k.clone())
            fused_ops.rotary_inplace(q, k, rope.cos_sin_cache, pos, d)
            record(f"rotary {t}x({nq}+{nk})x{d}", torch.cat([q, k], 1), torch.cat([ref_q, ref_k], 1), rel=0.0)
            q_norm, k_norm = (RMSNorm(d, kernels=reference).to(device=device, dtype=dtype) for _ in range(2))
            q_norm.weight.data, k_norm.weight.data = 1 + 0.1 * randn(d), 1 + 0.1 * randn(d)
            qk = randn(t, (nq + nk) * d)
            q, k = qk[:, :nq * d], qk[:, nq * d:]
            ref_q, ref_k = rope(pos, q_norm(q.view(t, nq, d)).view(t, -1), k_norm(k.view(t, nk, d)).view(t, -1))
            fused_ops.qk_norm_rotary_inplace(q, k, q_norm.weight, k_norm.weight, q_norm.variance_epsilon,
                                             rope.cos_sin_cache, pos, d)
            record(f"qk_norm+rotary {t}x({nq}+{nk})x{d}", torch.cat([q, k], 1), torch.cat([ref_q, ref_k], 1))
            inter_run = inter if device == "cuda" else 48
            act, silu = randn(t, 2 * inter_run), SiluAndMul(reference)
            record(f"silu_and_mul {t}x{inter_run}", fused_ops.silu_and_mul(act), silu(act))
    return rows + gemv_checks(device, dtype) + argmax_checks(device)


def argmax_checks(device: str) -> list[dict[str, Any]]:
    """Greedy sampling's two-pass argmax at the Qwen3 / Llama-3 vocabularies, 1 and 8 rows, float32 and bf16 logits
    (bf16: many ties, the first column must win), against torch.argmax: every index exactly."""
    import torch

    from lamina.kernels.argmax import argmax
    gen = torch.Generator(device).manual_seed(2)
    rows = []
    for vocab in [151936, 128256] if device == "cuda" else [5000]:
        for b in (1, 8):
            for dtype in (torch.float32, torch.bfloat16):
                logits = (4 * torch.randn(b, vocab, generator=gen, device=device)).to(dtype)
                got, want = argmax(logits), logits.argmax(dim=-1)
                rows.append(dict(name=f"argmax {b}x{vocab} {str(dtype).split('.')[-1]}",
                                 ok=bool(torch.equal(got, want)), max_abs_err=float((got != want).sum().item())))
    return rows


def gemv_checks(device: str, dtype: Any) -> list[dict[str, Any]]:
    """The decode GEMV at every Qwen3-0.6B / Llama-3-8B weight shape, 1, 2 and MAX_M rows, against F.linear."""
    import torch
    import torch.nn.functional as F

    from lamina.bench.gemv_sweep import shape_set
    from lamina.kernels.gemv import MAX_M, gemv
    shapes = [(n, k) for name in ("qwen3-0.6b", "llama3-8b") for _, n, k in shape_set(name)
              ] if device == "cuda" else [(40, 72)]
    gen = torch.Generator(device).manual_seed(1)
    rows = []
    for n, k in shapes:
        weight = (torch.randn(n, k, generator=gen, device=device) / k ** 0.5).to(dtype)
        for m in sorted({1, 2, MAX_M}):
            x = torch.randn(m, k, generator=gen, device=device).to(dtype)
            rows.append(compare(f"gemv {m}x{k} @ {n}x{k}", gemv(x, weight), F.linear(x, weight)))
    return rows


def prefill_flops(lens: list[int]) -> float:
    return 2.0 * H * D * sum(n * (n + 1) for n in lens)


def decode_bytes(ctx: int, elem: int = 2) -> float:
    return 2.0 * DECODE_BATCH * ctx * KV * D * elem


def bench(fn: Callable[[], object]) -> float:
    """Median milliseconds."""
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def paged_inputs(lens: list[int], q_lens: list[int], device: str) -> tuple[Any, ...]:
    import torch

    from tests.helpers.paged import build_metadata
    need = [-(-n // BLOCK) for n in lens]
    perm = (torch.randperm(sum(need)) + 1).tolist()
    tables, start = [], 0
    for n in need:
        tables.append(perm[start:start + n])
        start += n
    md = build_metadata([(t, n - q, q) for t, n, q in zip(tables, lens, q_lens)], BLOCK, device)
    shape = (sum(need) + 1, BLOCK, KV, D)
    kw = dict(dtype=torch.bfloat16, device=device)
    return md, torch.randn(shape, **kw), torch.randn(shape, **kw), torch.randn(sum(q_lens), H, D, **kw)


def bench_prefill(name: str, lens: list[int], sweep: bool, device: str = "cuda") -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from lamina.kernels.prefill_attention import prefill_attention
    md, k_cache, v_cache, q = paged_inputs(lens, lens, device)
    out = torch.empty_like(q)
    args = (q, k_cache, v_cache, out, md.block_tables, md.seq_lens, md.query_start_loc, md.max_query_len, D ** -0.5)
    times = {"shipped": bench(lambda: prefill_attention(*args))}
    for cfg in PREFILL_SWEEP if sweep else []:
        times[json.dumps(cfg)] = bench(lambda cfg=cfg: prefill_attention(*args, config=cfg))
    # SDPA gets one batched call per distinct length (the uniform batches are a single call)
    dense = [torch.randn(lens.count(n), H, n, D, dtype=torch.bfloat16, device=device) for n in set(lens)]
    sdpa_ms = bench(lambda: [F.scaled_dot_product_attention(x, x, x, is_causal=True) for x in dense])
    flops = prefill_flops(lens)
    best = min(times, key=times.get)
    return dict(workload=f"prefill {name}", tokens=sum(lens), lamina_ms=times["shipped"],
                lamina_tflops=flops / times["shipped"] / 1e9, best_config=best, best_tflops=flops / times[best] / 1e9,
                sdpa_ms=sdpa_ms, sdpa_tflops=flops / sdpa_ms / 1e9, sweep_ms=times)


def bench_decode(ctx: int, sweep: bool, device: str = "cuda") -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from lamina.kernels.decode_attention import choose_num_splits, decode_attention
    md, k_cache, v_cache, q = paged_inputs([ctx] * DECODE_BATCH, [1] * DECODE_BATCH, device)
    out = torch.empty_like(q)
    args = (q, k_cache, v_cache, out, md.block_tables, md.seq_lens, md.query_start_loc, 1, D ** -0.5)
    auto = choose_num_splits(ctx, DECODE_BATCH, KV)
    times = {f"splits={auto} (auto)": bench(lambda: decode_attention(*args, auto))}
    for splits in [1, 2, 4, 8, 16] if sweep else []:
        for cfg in DECODE_SWEEP:
            times[f"splits={splits} {json.dumps(cfg)}"] = bench(lambda s=splits, c=cfg: decode_attention(*args, s, c))
    kc = torch.randn(DECODE_BATCH, KV, ctx, D, dtype=torch.bfloat16, device=device)
    vc = torch.randn_like(kc)
    qd = q.view(DECODE_BATCH, H, 1, D)
    sdpa_ms = bench(lambda: F.scaled_dot_product_attention(qd, kc, vc, enable_gqa=True))
    nbytes = decode_bytes(ctx)
    first, best = next(iter(times)), min(times, key=times.get)
    return dict(workload=f"decode B{DECODE_BATCH} ctx {ctx}", lamina_us=times[first] * 1e3,
                lamina_tbs=nbytes / times[first] / 1e9, ceiling_frac=nbytes / times[first] / 1e9 / CEILING_TBS,
                best_config=best, best_tbs=nbytes / times[best] / 1e9, sdpa_contiguous_us=sdpa_ms * 1e3,
                sdpa_tbs=nbytes / sdpa_ms / 1e9, sweep_ms=times)


def dry_run_w5() -> list[dict[str, Any]]:
    """The W5 shapes and their work, metadata built, no large tensors allocated."""
    from tests.helpers.paged import build_metadata
    rows = []
    for name, lens in PREFILL_BATCHES.items():
        md = build_metadata([(list(range(1, -(-n // BLOCK) + 1)), 0, n) for n in lens], BLOCK)
        assert md.slot_mapping.shape[0] == sum(lens) and md.max_query_len == max(lens)
        rows.append(dict(workload=f"prefill {name}", tokens=sum(lens), gflop=prefill_flops(lens) / 1e9))
    for ctx in DECODE_CONTEXTS:
        rows.append(dict(workload=f"decode B{DECODE_BATCH} ctx {ctx}", kv_gb=decode_bytes(ctx) / 1e9,
                         ceiling_us=decode_bytes(ctx) / CEILING_TBS / 1e6))
    return rows


def print_table(rows: list[dict[str, Any]], keys: list[str]) -> None:
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(fmt(row.get(k, "")) for k in keys))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny checks under TRITON_INTERPRET=1 on CPU")
    parser.add_argument("--quick", action="store_true", help="skip the tile / split sweep")
    parser.add_argument("--engine", action="store_true", help="only the engine section (CUDA graphs, W2)")
    args = parser.parse_args()
    if args.engine:
        from gpu_check_engine import engine_main  # scripts/ is on sys.path when this file runs
        return engine_main(args.dry_run)
    if args.dry_run:
        import tests.kernels.conftest  # noqa: F401 - sets TRITON_INTERPRET=1 (+ interpreter fixes) first
    import torch
    import triton
    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: use --dry-run")
    report: dict[str, Any] = dict(torch=torch.__version__, triton=triton.__version__,
                                  device=torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)")
    report["checks"] = [run_check(spec, device) for spec in checks(tiny=args.dry_run)] + op_checks(device)
    for c in report["checks"]:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}  max|err| {c['max_abs_err']:.2e}")
    if args.dry_run:
        report["w5"] = dry_run_w5()
    else:
        report["w5_prefill"] = [bench_prefill(n, lens, not args.quick) for n, lens in PREFILL_BATCHES.items()]
        report["w5_decode"] = [bench_decode(ctx, not args.quick) for ctx in DECODE_CONTEXTS]
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps(report, indent=1))
    print(f"\n{report['device']}, torch {report['torch']}, triton {report['triton']}")
    print(f"checks: {sum(c['ok'] for c in report['checks'])}/{len(report['checks'])} passed\n")
    if args.dry_run:
        print_table(report["w5"], ["workload", "tokens", "gflop", "kv_gb", "ceiling_us"])
    else:
        print_table(report["w5_prefill"], ["workload", "tokens", "lamina_tflops", "sdpa_tflops", "best_tflops",
                                           "best_config"])
        print()
        print_table(report["w5_decode"], ["workload", "lamina_us", "lamina_tbs", "ceiling_frac", "sdpa_tbs",
                                          "best_tbs", "best_config"])
    return 0 if all(c["ok"] for c in report["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The paged decode kernel over a bf16 cache and over an fp8 (e4m3) cache, for a grid of launch configs (issue #13).

W1 ran slower with the fp8 cache than with bf16 (0.89x on the H200): this times the decode kernel alone at W1-like
and long-context shapes (Qwen3-0.6B's heads) to find the fp8 cache's config: BLOCK_N (an fp8 tile of the same
bytes holds twice the keys), num_warps, num_stages, and F16_DOT (the dots in fp16, whose e4m3 conversion is
cheaper than bf16's).

    PYTHONPATH=. python scripts/fp8_kv_decode_sweep.py [--result-file out.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lamina.kernels.decode_attention import choose_num_splits, decode_attention  # noqa: E402
from tests.kernels.cases import make_case  # noqa: E402

FP8 = torch.float8_e4m3fn
SHAPES = {  # name: seq_lens (one query token each)
    "w1-256x(256..2048)": [random.Random(0).randrange(256, 2048) for _ in range(256)],
    "64x4096": [4096] * 64,
    "16x16384": [16384] * 16,
}
# F16_DOT=0 lost everywhere in the twelfth session's sweep (64/128 x 4/8 warps x 2-4 stages); num_stages 1 (no
# cp.async pipeline): the main loop's SASS is 129 warp-instructions per KB of K/V against 178 with 3 stages
FP8_CONFIGS = [dict(BLOCK_N=n, num_warps=w, num_stages=s, F16_DOT=1)
               for n, w, s in itertools.product((64, 128, 256), (4, 8), (1, 2, 3))]


def time_us(case, k_cache, v_cache, scales, config) -> float:
    meta = case.metadata
    out = torch.empty_like(case.q)
    splits = choose_num_splits(meta.max_seq_len, meta.num_seqs, k_cache.shape[2])

    def call():
        decode_attention(case.q, k_cache, v_cache, out, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                         1, case.scale, splits, config=config, kv_scales=scales)
    return triton.testing.do_bench(call, warmup=10, rep=50) * 1e3


def sweep(name: str, seq_lens: list[int]) -> list[dict]:
    case = make_case(seq_lens, [1] * len(seq_lens), 16, 8, 128, 16, torch.bfloat16, seed=1, device="cuda")
    k8, v8 = case.k_cache.to(FP8), case.v_cache.to(FP8)
    ones = torch.ones(8, device="cuda")
    kv_bytes = 2 * sum(seq_lens) * 8 * 128
    rows = [{"shape": name, "cache": "bf16", "config": "default",
             "us": time_us(case, case.k_cache, case.v_cache, None, None), "kv_bytes": 2 * kv_bytes}]
    rows.append({"shape": name, "cache": "fp8", "config": "default",
                 "us": time_us(case, k8, v8, (ones, ones), None), "kv_bytes": kv_bytes})
    for config in FP8_CONFIGS:
        try:
            us = time_us(case, k8, v8, (ones, ones), config)
        except Exception as error:  # noqa: BLE001 — a config that does not fit shared memory
            print(f"{name} {config}: {type(error).__name__}")
            continue
        rows.append({"shape": name, "cache": "fp8", "config": config, "us": us, "kv_bytes": kv_bytes})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args()
    rows = [row for name, lens in SHAPES.items() for row in sweep(name, lens)]
    for name in SHAPES:
        mine = [r for r in rows if r["shape"] == name]
        bf16, fp8 = mine[0], mine[1]
        best = min(mine[2:], key=lambda r: r["us"])
        print(f"{name:20s} bf16 {bf16['us']:8.1f} us ({bf16['kv_bytes'] / bf16['us'] / 1e6:.2f} TB/s)  "
              f"fp8 default {fp8['us']:8.1f} us  fp8 best {best['us']:8.1f} us "
              f"({best['kv_bytes'] / best['us'] / 1e6:.2f} TB/s) {best['config']}")
        for row in sorted(mine[2:], key=lambda r: r["us"])[:6]:
            print(f"    {row['us']:8.1f} us  {row['config']}")
    if args.result_file:
        Path(args.result_file).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows},
                                                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

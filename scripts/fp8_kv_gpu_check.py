"""The fp8 KV cache's kernels on the GPU at real shapes (issue #13): the store writes the reference's e4m3 bytes and
both attention kernels equal attention over the dequantized cache (bf16 queries, Qwen3-0.6B's heads).

    PYTHONPATH=. python scripts/fp8_kv_gpu_check.py [--result-file out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lamina.attention import torch_ref  # noqa: E402
from lamina.attention.backends import get_attention_backend  # noqa: E402
from tests.kernels.cases import make_case  # noqa: E402

FP8 = torch.float8_e4m3fn
CASES = {  # (seq_lens, q_lens): prefills, chunks over prefixes, decodes, 1 + 7 verifications, long split decodes
    "mixed": ([512, 700, 300, 2048, 90, 4000], [512, 188, 1, 8, 90, 1]),
    "decode-64": ([1024 + 61 * i for i in range(64)], [1] * 64),
}


def check(name: str, seq_lens: list[int], q_lens: list[int]) -> dict:
    case = make_case(seq_lens, q_lens, 16, 8, 128, 16, torch.bfloat16, seed=1, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(2)
    scales = tuple(torch.rand(8, generator=gen, device="cuda") * 2 + 0.05 for _ in range(2))
    k_cache, v_cache = case.k_cache.to(FP8), case.v_cache.to(FP8)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    out = get_attention_backend("triton").forward(case.q, case.k, case.v, k_cache, v_cache, case.metadata,
                                                  case.scale, scales)
    torch_ref.store_kv(case.k, case.v, ref_k, ref_v, case.metadata.slot_mapping, scales)
    same_bytes = bool(torch.equal(k_cache.view(torch.uint8), ref_k.view(torch.uint8))
                      and torch.equal(v_cache.view(torch.uint8), ref_v.view(torch.uint8)))
    deq = [torch_ref.dequantize(c, s).nan_to_num(0.0) for c, s in ((ref_k, scales[0]), (ref_v, scales[1]))]
    expected = torch_ref.paged_attention(case.q.float(), *deq, case.metadata, case.scale)
    error = float((out.float() - expected).norm() / expected.norm())
    ok = same_bytes and error < 1e-2 and not out.isnan().any()
    return {"case": name, "store_bytes_equal": same_bytes, "relative_error": error, "ok": ok}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args()
    rows = [check(name, *shape) for name, shape in CASES.items()]
    for row in rows:
        print(f"{row['case']:10s} store bytes equal {row['store_bytes_equal']}  |out - ref| / |ref| "
              f"{row['relative_error']:.2e}  {'ok' if row['ok'] else 'FAIL'}")
    if args.result_file:
        Path(args.result_file).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

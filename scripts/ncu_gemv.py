"""One decode GEMV of the Llama-3-8B shapes, launched a few times, for Nsight Compute (issue #13: why the int8
weight-only GEMV streams slower than the bf16 one).

    ncu --clock-control none --set full -k regex:"_wna16_row_kernel|_wna16_tc_kernel|_gemv_kernel" \\
        --launch-skip 2 --launch-count 1 python scripts/ncu_gemv.py --kind int8 --shape gate_up

--kind: bf16 (lamina.kernels.gemv, what the engine runs on a bf16 model), int8 (per channel, symmetric) or int4
(g128 with zero points), both through the default config of lamina.kernels.wna16_row, or of wna16_tc with
--kernel tc; --rows 1..4 (1..16 with tc). The launches rotate
over up to four weight copies, together larger than the 60 MB L2, so a profiled launch streams from HBM as in a
model (ncu also flushes the caches between its passes). The output of the last launch is checked against the
reference (a profile of a wrong kernel is worthless).
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
KINDS = {"int8": (8, None, True), "int4": (4, 128, False)}  # bits, group size, symmetric


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=["bf16", *KINDS], default="int8")
    parser.add_argument("--shape", choices=list(SHAPES), default="gate_up")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--kernel", choices=["row", "tc"], default="row", help="int4 / int8: wna16_row or wna16_tc")
    parser.add_argument("--launches", type=int, default=4)
    args = parser.parse_args()
    n, k = SHAPES[args.shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(args.rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    copies = max(2, math.ceil(256 * 2 ** 20 / (n * k)))
    if args.kind == "bf16":
        from lamina.kernels.gemv import gemv

        weights = [(torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(torch.bfloat16)
                   for _ in range(min(copies, 4))]
        for i in range(args.launches):
            out = gemv(x, weights[i % len(weights)])
        ref = F.linear(x.float(), weights[(args.launches - 1) % len(weights)].float())
    else:
        from lamina.bench.quant_speed import quant_copy, reference
        from lamina.kernels.wna16_row import wna16_row_gemv
        from lamina.kernels.wna16_tc import wna16_tc_gemv

        gemv_fn = wna16_tc_gemv if args.kernel == "tc" else wna16_row_gemv
        bits, group_size, symmetric = KINDS[args.kind]
        ops = [quant_copy(n, k, bits, group_size, symmetric, "cuda", gen) for _ in range(min(copies, 4))]
        for i in range(args.launches):
            op = ops[i % len(ops)]
            out = gemv_fn(x, op["words"], op["scale"], op["zero"], None, bits, group_size)
        ref = reference(x, ops[(args.launches - 1) % len(ops)], k).float()
    torch.cuda.synchronize()
    err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
    print(f"{args.kind} {args.kernel} {args.shape} rows {args.rows}: max error / max {err:.2e}")
    return 0 if err < 2 ** -6 else 1


if __name__ == "__main__":
    raise SystemExit(main())

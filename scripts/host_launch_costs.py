"""Host time of the small launches a batch-1 step makes, on this machine's GPU (issue #12: at batch 1 a small
model's step is bound by the host, not the device).

    python scripts/host_launch_costs.py

Each row: microseconds of host time a call (3,000 calls after 50 warm-ups, no sync between them): the greedy argmax
(two Triton kernels) against torch.argmax, a CUDA allocation, a CUDA generator seeded, and the sampling keys of one
row (philox_keys: Python ints for a few seeded rows; seeded_keys: numpy).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lamina.layers import sampling_metadata  # noqa: E402
from lamina.layers.sampler import greedy_tokens  # noqa: E402


def host_us(fn, calls: int = 3000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e6 * seconds / calls


def main() -> None:
    one, eight = torch.randn(1, 32000, device="cuda"), torch.randn(8, 32000, device="cuda")
    rows = {
        "triton two-pass argmax, 1 x 32000": lambda: greedy_tokens(one),
        "triton two-pass argmax, 8 x 32000": lambda: greedy_tokens(eight),
        "torch.argmax, 1 x 32000": lambda: one.argmax(dim=-1),
        "torch.empty(1) cuda": lambda: torch.empty(1, device="cuda"),
        "torch.Generator(cuda).manual_seed": lambda: torch.Generator("cuda").manual_seed(12345),
        "philox_keys 1 seeded row (python ints)": lambda: sampling_metadata.philox_keys([0], [100], 7),
        "seeded_keys 1 row (numpy)": lambda: sampling_metadata.seeded_keys([0], [100]),
        "philox_keys 1 unseeded row": lambda: sampling_metadata.philox_keys([None], [100], 7),
    }
    for name, fn in rows.items():
        print(f"{host_us(fn):8.2f} us  {name}")


if __name__ == "__main__":
    main()

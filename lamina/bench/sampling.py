"""Sampling at W1's shape: the sorting-free Triton kernel against the torch path, and its exactness.

    python -m lamina.bench.sampling --result-file sampling.json    # CUDA: timings + chi-square, ~20 s
    python -m lamina.bench.sampling --dry-run                      # CPU interpreter, tiny vocabulary

Timings (triton.testing.do_bench, median) per step of B rows x V = 151,936 float32 logits: greedy argmax,
then temperature 0.6, + top-p 0.95, + top-k 50, each through the kernel and through the torch path
(lamina.layers.sampler's oracle: sort for top-p, exponential race). Exactness: 200k kernel draws from
one row whose kept set is small, against the exact float64 distribution (Pearson chi-square, alpha 1e-3).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from lamina.layers.sampler import apply_min_p, exponential_race, kth_largest, top_p_threshold

VOCAB = 151_936
CASES = {"T 0.6": dict(temperature=0.6), "T 0.6 top-p 0.95": dict(temperature=0.6, top_p=0.95),
         "T 0.6 top-k 50": dict(temperature=0.6, top_k=50),
         "T 0.8 top-k 40 top-p 0.9 min-p 0.05": dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05)}


def exact_probs(row: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0,
                min_p: float = 0.0) -> torch.Tensor:
    """The kept distribution of one row in float64, step by step as the torch sampler does it."""
    x = row.double().unsqueeze(0) / temperature
    if top_k:
        x = x.masked_fill(x < kth_largest(x, torch.tensor([top_k]), top_k).unsqueeze(1), float("-inf"))
    if top_p < 1.0:
        x = x.masked_fill(x < top_p_threshold(x, torch.tensor([top_p], dtype=x.dtype)).unsqueeze(1),
                          float("-inf"))
    probs = x.softmax(dim=-1)
    if min_p:
        probs = apply_min_p(probs, torch.tensor([min_p], dtype=probs.dtype))
    return (probs / probs.sum()).squeeze(0)


def kernel_args(n: int, device: torch.device, logits: torch.Tensor, temperature: float, top_p: float = 1.0,
                top_k: int = 0, min_p: float = 0.0, key_base: int = 0) -> dict[str, Any]:
    full = lambda v: torch.full((n,), v, dtype=torch.float32, device=device)  # noqa: E731
    kth = None
    if top_k:
        kth = kth_largest(logits, torch.full((n,), top_k, device=device), top_k)
    return dict(temperature=full(temperature), seeds=torch.arange(n, device=device) + key_base,
                top_p=full(top_p) if top_p < 1.0 else None, min_p=full(min_p) if min_p else None, kth=kth)


def torch_path(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0,
               min_p: float = 0.0) -> torch.Tensor:
    n = logits.shape[0]
    x = logits / temperature
    if top_k:
        x = x.masked_fill(x < kth_largest(x, torch.full((n,), top_k, device=x.device), top_k).unsqueeze(1),
                          float("-inf"))
    if top_p < 1.0:
        x = x.masked_fill(x < top_p_threshold(x, torch.full((n,), top_p, device=x.device)).unsqueeze(1),
                          float("-inf"))
    probs = x.softmax(dim=-1)
    if min_p:
        probs = apply_min_p(probs, torch.full((n,), min_p, device=x.device))
    return exponential_race(probs, {}, None)


def chi2_critical(df: int, alpha: float = 1e-3) -> float:
    """x with P(chi2_df > x) = alpha, by bisection on the regularised upper incomplete gamma."""
    lo, hi = 0.0, 10.0 * df + 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        tail = torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                       torch.tensor(mid / 2, dtype=torch.float64)).item()
        lo, hi = (mid, hi) if tail > alpha else (lo, mid)
    return lo


def pearson(counts: torch.Tensor, expected: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's statistic and its number of bins; tokens expected fewer than 5 times share one bin."""
    small = expected < min_expected
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum().unsqueeze(0)])
        expected = torch.cat([expected[~small], expected[small].sum().unsqueeze(0)])
    return float((((counts - expected) ** 2) / expected).sum()), int(counts.numel())


def exactness(sample: Callable, vocab: int, device: torch.device, draws: int, per_launch: int) -> list[dict]:
    """Kernel draws from a row with a small kept set, for each case, against exact_probs."""
    gen = torch.Generator().manual_seed(0)
    row = torch.randn(vocab, generator=gen)
    row[torch.randperm(vocab, generator=gen)[:30]] += 6.0  # a head of ~30 tokens above a long tail
    results = []
    for name, params in CASES.items():
        expected = exact_probs(row, **params)
        counts = torch.zeros(vocab, dtype=torch.float64)
        logits = row.to(device).repeat(per_launch, 1)
        for launch in range(draws // per_launch):
            args = kernel_args(per_launch, device, logits, key_base=launch * per_launch + 1, **params)
            counts += torch.bincount(sample(logits, **args).cpu(), minlength=vocab).double()
        support = expected > 0
        outside = int(counts[~support].sum())
        stat, bins = pearson(counts[support], expected[support] * counts.sum())
        critical = chi2_critical(bins - 1)
        results.append(dict(case=name, draws=int(counts.sum()), support=int(support.sum()), bins=bins,
                            outside=outside, chi2=round(stat, 1), critical=round(critical, 1),
                            ok=outside == 0 and stat < critical))
    return results


def timings(sample: Callable, device: torch.device, batches: list[int]) -> list[dict]:
    from triton.testing import do_bench
    rows = []
    for n in batches:
        logits = torch.randn(n, VOCAB, device=device) * 3
        row = dict(batch=n, greedy_us=round(do_bench(lambda: logits.argmax(dim=-1)) * 1e3, 1))
        for name, params in CASES.items():
            args = kernel_args(n, device, logits, **params)
            row[f"{name} kernel_us"] = round(do_bench(lambda: sample(logits, **args)) * 1e3, 1)
            row[f"{name} torch_us"] = round(do_bench(lambda: torch_path(logits, **params)) * 1e3, 1)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result-file", default=None)
    parser.add_argument("--dry-run", action="store_true", help="CPU interpreter: tiny vocabulary, few draws")
    args = parser.parse_args(argv)
    from lamina.kernels.sampling import sample
    device = torch.device("cpu" if args.dry_run else "cuda")
    if args.dry_run:
        report = dict(exactness=exactness(lambda *a, **k: sample(*a, block_v=16, **k), 64, device, 200, 100))
    else:
        report = dict(exactness=exactness(sample, VOCAB, device, 200_000, 4000),
                      timings=timings(sample, device, [1, 64, 256]))
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(report, indent=1))
    for row in report["exactness"]:
        print(" | ".join(f"{k} {v}" for k, v in row.items()))
    for row in report.get("timings", []):
        print(" | ".join(f"{k} {v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How often the speculation gate runs its slower arm when every window's rate is noisy (issue #12: never slower).

    PYTHONPATH=. python scripts/spec_gate_noise.py [--windows 2000] [--seeds 20]

A simulation of lamina.engine.spec_gate.SpecGate alone, on one batch bucket: speculation runs at `ratio` of the
plain arm's rate, and each window's rate is multiplied by a factor drawn uniformly from [1 - noise, 1 + noise] (a
host whose speed moves between windows, as the H100 / H200 hosts' did by 7-16 % a repeat). Prints, for each
ratio and noise, the share of windows run with speculation and the throughput against an engine without
speculation on the same host (the same noise draws); then how many windows the gate takes to follow a change of
workload (speculation at 0.90 of plain for SETTLE windows, then at 1.12: the windows until it leads), median and
90th percentile over the seeds; then, at batch 1, the throughput over always running the fastest arm where greedy
and sampled rows alternate (ALTERNATING) and the gate measures them apart, against one bucket for both.
"""
from __future__ import annotations

import argparse
import random

from lamina.engine.spec_gate import Arm, SpecGate

RATIOS = (0.43, 0.50, 0.90, 0.95, 0.97, 1.00, 1.03, 1.05, 1.10, 1.20, 2.00)
NOISES = (0.0, 0.05, 0.10, 0.20)
SETTLE = 300  # windows of the first workload before the change


def window_steps(gate: SpecGate, rate: float, greedy: bool = False) -> float:
    """Feed the gate one window of steps at `rate` (a step: one token in 1 / rate seconds) until it ends the window
    (WINDOW steps; a probe may end sooner); the window's seconds. `greedy`: the steps' rows all are."""
    if gate.window_log is None:
        gate.window_log = []
    ended, seconds = len(gate.window_log), 0.0
    while len(gate.window_log) == ended:
        gate.observe(1, 1, 1 / rate, gate.arm, greedy=greedy)
        seconds += 1 / rate
    return seconds


def simulate(ratio: float, noise: float, windows: int, seed: int) -> tuple[int, float]:
    """(windows run with speculation, throughput against the plain engine's on the same host) for one seeded run."""
    rng, gate = random.Random(seed), SpecGate()
    spec_windows, seconds, plain_seconds = 0, 0.0, 0.0
    for _ in range(windows):
        spec = not gate.plain
        spec_windows += spec
        host = rng.uniform(1 - noise, 1 + noise)
        took = window_steps(gate, (ratio if spec else 1.0) * host)
        seconds, plain_seconds = seconds + took, plain_seconds + took * (ratio if spec else 1.0)
    return spec_windows, plain_seconds / seconds


def windows_to_follow(noise: float, seed: int, before: float = 0.90, after: float = 1.12, limit: int = 1000) -> int:
    """Windows after speculation's rate goes from `before` to `after` of plain's (SETTLE windows in) until it
    leads (`limit` if it never does)."""
    rng, gate = random.Random(seed), SpecGate()
    for window in range(SETTLE + limit):
        ratio = before if window < SETTLE else after
        window_steps(gate, (1.0 if gate.plain else ratio) * rng.uniform(1 - noise, 1 + noise))
        if window >= SETTLE and not gate.plain and gate.buckets[1, False].leader is gate.arm:
            return window - SETTLE
    return limit


# batch 1, rates over plain's: greedy rows where drafting without the policy (FULL) beats the policy (SPEC),
# sampled ones where it does not or barely (shaped after the H200's n-gram rows, docs/BENCHMARKS.md, session 42)
ALTERNATING = [(True, {Arm.SPEC: 1.6, Arm.FULL: 2.2}), (False, {Arm.SPEC: 1.3, Arm.FULL: 1.0}),
               (True, {Arm.SPEC: 1.5, Arm.FULL: 1.9}), (False, {Arm.SPEC: 1.2, Arm.FULL: 1.25}),
               (True, {Arm.SPEC: 1.7, Arm.FULL: 2.4}), (False, {Arm.SPEC: 1.25, Arm.FULL: 1.2})]


def alternating(apart: bool, windows: int, noise: float, seed: int, rounds: int = 3) -> float:
    """Throughput against always running each row's fastest arm, over `rounds` of ALTERNATING's rows of `windows`
    windows each; apart=False: the steps are all told sampled (one bucket for both kinds, as before session 44)."""
    rng, gate = random.Random(seed), SpecGate(full=True)
    seconds = best_seconds = 0.0
    for greedy, rates in ALTERNATING * rounds:
        rates = {Arm.PLAIN: 1.0, **rates}
        for _ in range(windows):
            rate = rates[gate.arm]
            took = window_steps(gate, rate * rng.uniform(1 - noise, 1 + noise), greedy and apart)
            seconds, best_seconds = seconds + took, best_seconds + took * rate / max(rates.values())
    return best_seconds / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    print("spec/plain  " + "  ".join(f"noise {n:.2f}: spec share, rate" for n in NOISES))
    for ratio in RATIOS:
        cells = []
        for noise in NOISES:
            runs = [simulate(ratio, noise, args.windows, seed) for seed in range(args.seeds)]
            share = sum(s for s, _ in runs) / (args.windows * args.seeds)
            rate = sum(r for _, r in runs) / len(runs)
            cells.append(f"{share:17.3f} {rate:5.3f}")
        print(f"{ratio:10.2f}  " + "  ".join(cells))
    print(f"windows to follow a change of workload (0.90 -> 1.12 after {SETTLE}), median / 90th percentile:")
    for noise in NOISES:
        taken = sorted(windows_to_follow(noise, seed) for seed in range(args.seeds))
        print(f"  noise {noise:.2f}: {taken[len(taken) // 2]} / {taken[int(0.9 * (len(taken) - 1))]}")
    print("greedy and sampled rows alternating (ALTERNATING), throughput against each row's fastest arm:")
    for windows in (30, 100):
        for noise in NOISES:
            apart, shared = (sum(alternating(a, windows, noise, seed) for seed in range(args.seeds)) / args.seeds
                             for a in (True, False))
            print(f"  {windows} windows a row, noise {noise:.2f}: measured apart {apart:.3f}, one bucket {shared:.3f}")


if __name__ == "__main__":
    main()

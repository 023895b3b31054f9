"""Where a step's host time goes, with and without speculation (issue #12).

    python scripts/profile_spec.py [--model DIR] [--methods ngram] [--new-tokens 512] [--batch-size 1] [--top 30]
                                   [--sort tottime|cumtime] [--profiler cprofile|torch|timeline|none] [--prompt TEXT]

Batch 1: one long greedy and one T=0.6 generation per engine (of --prompt: a repetitive one makes every step of
n-gram with k fixed a verify step of k + 1 tokens, so that the kernels a step are a verify step's); a larger batch:
the throughput prompts of lamina.bench.spec at T=0.6. Each under cProfile; prints each engine's step times by kind
(from the engine's step log), the host time of its speculator's decisions (SpecDecodeStats.draft_seconds over
policy_steps) and the functions with the most own (or cumulative) time. Each kind of step shows its mean wall time
and, in brackets, the part of it the host spent in the step's `result()` (waiting for its tokens, then a worker-side
proposer's drafting launch). --profiler torch: the device's kernels instead (torch.profiler: device time a step, by
kernel); timeline: the device's busy stretches and the idle gaps between them (torch.profiler's timestamps: how much
of a step the device waits for the host, and where); none: the step times alone, without a profiler's overhead.
--methods: bench labels (lamina.bench.spec.spec_config: ngram, eagle, draft_model, eagle-fixed, ngram@3, ...;
METHOD-plain holds that engine's gate in plain windows, as the bench does).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import itertools
import pstats
import time

import torch
from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import PROMPT_SETS, held_plain, spec_config
from lamina.engine.spec_gate import Arm

PROMPT = "def fibonacci(n):\n"


def prompts_for(batch_size: int, prompt: str = PROMPT) -> list[str]:
    if batch_size == 1:
        return [prompt]
    everything = [p for prompts in PROMPT_SETS.values() for p in prompts]
    return list(itertools.islice(itertools.cycle(everything), batch_size))


def _profiler(kind: str) -> cProfile.Profile | torch.profiler.profile | None:
    """A context manager that profiles the host's Python (cprofile) or the device's kernels (torch)."""
    if kind == "cprofile":
        return cProfile.Profile()
    if kind in ("torch", "timeline"):
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
    return None


def print_kernels(profiler: torch.profiler.profile, steps: int, top: int) -> None:
    """Device time a step, in all and by kernel (most first)."""
    rows = sorted(((e.device_time_total / 1e3 / steps, e.count / steps, e.key) for e in profiler.key_averages()
                   if e.device_time_total > 0 and e.device_type.name == "CUDA"), reverse=True)
    print(f"   device time a step: {sum(r[0] for r in rows):.3f} ms in {sum(r[1] for r in rows):.0f} kernels")
    for ms, calls, name in rows[:top]:
        print(f"   {ms:8.4f} ms  {calls:5.1f}x  {name[:100]}")


GAP_US = 10.0  # an idle stretch of the device longer than this ends a busy stretch


def print_timeline(profiler: torch.profiler.profile, steps: int, show: int = 24) -> None:
    """The device's busy stretches (kernels and copies closer than GAP_US apart) and the gaps between them: the
    totals a step, then `show` stretches from the middle of the run as (kernels, busy us) + gap us."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in profiler.events()
                   if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    if not spans:
        print("   no device events")
        return
    stretches, (start, end), count = [], spans[0], 1
    for s, e in spans[1:]:
        if s - end > GAP_US:
            stretches.append((start, end, count))
            start, end, count = s, e, 0
        end, count = max(end, e), count + 1
    stretches.append((start, end, count))
    busy = sum(e - s for s, e, _ in stretches)
    idle = sum(b[0] - a[1] for a, b in zip(stretches, stretches[1:]))
    print(f"   device a step: busy {busy / steps / 1e3:.3f} ms, idle {idle / steps / 1e3:.3f} ms in gaps > "
          f"{GAP_US:.0f} us ({(len(stretches) - 1) / steps:.1f} a step)")
    middle = len(stretches) // 2
    shown = stretches[middle:middle + show + 1]
    print("   " + " ".join(f"[{n} {e - s:.0f}] {nxt[0] - e:.0f}" for (s, e, n), nxt in zip(shown, shown[1:])))


def profile(label: str, spec: dict | None, args: argparse.Namespace) -> None:
    llm = LLM(model=args.model, speculative_config=spec, gpu_memory_utilization=0.3)
    if held_plain(label):
        llm.engine.speculator.gate.hold(Arm.PLAIN)
    prompts = prompts_for(args.batch_size, args.prompt)
    llm.generate(prompts, SamplingParams(max_tokens=16), use_tqdm=False)
    for temperature in (0.0, 0.6) if args.batch_size == 1 else (0.6,):
        params = SamplingParams(temperature=temperature, max_tokens=args.new_tokens, ignore_eos=True, seed=0)
        llm.engine.step_log = []
        before = llm.engine.get_stats().snapshot().spec
        profiler = _profiler(args.profiler)
        start = time.perf_counter()
        with profiler or contextlib.nullcontext():
            outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        kinds: dict[str, list] = {}
        for step in llm.engine.step_log:
            kinds.setdefault(step.kind, []).append(step)
        steps = ", ".join(f"{k} {len(v)} x {1000 * sum(s.seconds for s in v) / len(v):.3f} ms "
                          f"({1000 * sum(s.device_wait_s for s in v) / len(v):.3f})" for k, v in kinds.items())
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        how = "" if profiler is None else f" (under {args.profiler})"
        print(f"== {label} batch {args.batch_size} T={temperature}: {tokens / seconds:.0f} tok/s{how}; {steps}")
        after = llm.engine.get_stats().snapshot().spec
        if spec is not None:
            decided = after.policy_steps - before.policy_steps
            drafting_ms = 1000 * (after.draft_seconds - before.draft_seconds)
            print(f"   decisions with a request that could draft: {decided}, drafting host time {drafting_ms:.1f} ms "
                  f"({drafting_ms / max(decided, 1):.3f} ms each)")
        if args.profiler == "cprofile":
            restrictions = ("lamina/", args.top) if args.sort == "cumtime" else (args.top,)  # cumtime: our frames
            pstats.Stats(profiler).sort_stats(args.sort).print_stats(*restrictions)
        elif args.profiler == "torch":
            print_kernels(profiler, len(llm.engine.step_log), args.top)
        elif args.profiler == "timeline":
            print_timeline(profiler, len(llm.engine.step_log))
    llm.engine.executor.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--methods", default="ngram", help="comma-separated bench labels (default: ngram)")
    parser.add_argument("--sort", choices=("tottime", "cumtime"), default="tottime")
    parser.add_argument("--profiler", choices=("cprofile", "torch", "timeline", "none"), default="cprofile")
    parser.add_argument("--prompt", default=PROMPT, help="the prompt at batch 1")
    args = parser.parse_args()
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    profile("off", None, args)
    for label in filter(None, args.methods.split(",")):
        profile(label, spec_config(label), args)


if __name__ == "__main__":
    main()

"""Sampled drafts on a GPU (issue #12): what the CPU tests cannot show, through the engine's CUDA graphs.

    PYTHONPATH=. python scripts/spec_draft_sampling_check.py [--new-tokens 128] [--result-file out.json]
        [--engines off,self_tree] [--num-prompts 24] [--enforce-eager] [--dtype float32]

The demo model on the bench's 24 prompts, three ways per engine: seeded at T = 0.6, unseeded at T = 0.6, greedy.
Engines: no speculation; the demo model as its own draft model (drafts drawn inside the drafting CUDA graph by the
sampling kernel with the verify rows' keys: at temperature nearly every draft is the verify row's own sample, so
acceptance near 1 shows the keys and the kernel's noise line up; bf16 rounding between the two forwards may flip
a few); the demo draft model; EAGLE (argmax drafts); tree drafts (lamina.bench.spec.BENCH_TREE: the draft model's
tree drafting in its captured tree loop, the verify graphs with TreeMask rows) of the demo model for itself, of the
demo draft model and of the Medusa heads (a tree's acceptance counts its nodes: the demo model's tree for itself
should accept its whole main chain, 3 of the 7 nodes a step, on the CPU 0.53 with 12 tokens, where max_tokens cuts
the last steps' trees). For each: acceptance, and how many seeded and greedy outputs
equal the engine without speculation (verify rows compute over 1 + k tokens where plain steps compute over one, so bf16
rounding may part a few texts on a GPU: the first differing index is listed). Prints one JSON line per engine.
"""
from __future__ import annotations

import argparse
import gc
import json
import time

import torch

from lamina import DEMO_DRAFT, DEMO_EAGLE, DEMO_MEDUSA, DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import BENCH_TREE, PROMPT_SETS

SPECS = {"off": None,
         "self": {"method": "draft_model", "model": DEMO_MODEL, "num_speculative_tokens": 3, "adaptive": False},
         "draft_model": {"method": "draft_model", "model": DEMO_DRAFT, "num_speculative_tokens": 3,
                         "adaptive": False},
         "eagle": {"method": "eagle", "model": DEMO_EAGLE, "num_speculative_tokens": 3, "adaptive": False},
         "self_tree": {"method": "draft_model", "model": DEMO_MODEL, "speculative_token_tree": BENCH_TREE,
                       "adaptive": False},
         "draft_model_tree": {"method": "draft_model", "model": DEMO_DRAFT, "speculative_token_tree": BENCH_TREE,
                              "adaptive": False},
         "medusa_tree": {"method": "medusa", "model": DEMO_MEDUSA, "speculative_token_tree": BENCH_TREE,
                         "adaptive": False}}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def _counts(llm: LLM) -> tuple[int, int]:
    stats = llm.engine.get_stats().spec
    return stats.num_draft_tokens, stats.num_accepted_tokens


def run_engine(spec: dict | None, workloads: dict[str, list[SamplingParams]], prompts: list[str],
               plain: dict[str, list[list[int]]], enforce_eager: bool = False, dtype: str = "auto") -> dict:
    start = time.perf_counter()
    llm = LLM(DEMO_MODEL, speculative_config=spec, enforce_eager=enforce_eager, dtype=dtype)
    row: dict = {"start_s": round(time.perf_counter() - start, 1)}
    for label, params in workloads.items():
        before = _counts(llm)  # (the stats object is live: read its numbers now)
        tokens = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        drafted, accepted = (a - b for a, b in zip(_counts(llm), before))
        row[label] = {"draft_tokens": drafted, "acceptance": round(accepted / max(drafted, 1), 4)}
        if spec is None:
            plain[label] = tokens
        elif label != "unseeded T=0.6" and label in plain:  # (unseeded texts differ by design)
            firsts = [first_difference(a, b) for a, b in zip(tokens, plain[label])]
            row[label].update(same_as_off=firsts.count(None), of=len(firsts),
                              first_differences=[f for f in firsts if f is not None])
    llm.engine.check_integrity()
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--result-file", default=None)
    parser.add_argument("--engines", default=",".join(SPECS), help=f"comma-separated, of {', '.join(SPECS)}")
    parser.add_argument("--num-prompts", type=int, default=None, help="the first N of the 24 prompts")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (engine and drafter)")
    parser.add_argument("--dtype", default="auto",
                        help="the engines' dtype (float32: far less rounding between a verify step and a plain one)")
    args = parser.parse_args()
    engines = sorted(args.engines.split(","), key=lambda e: e != "off")  # off first: the others compare with it
    unknown = sorted(set(engines) - set(SPECS))
    if unknown:
        parser.error(f"--engines: unknown {unknown}; allowed: {', '.join(SPECS)}")
    prompts = [p for ps in PROMPT_SETS.values() for p in ps][:args.num_prompts]
    n = args.new_tokens
    workloads = {
        "seeded T=0.6": [SamplingParams(temperature=0.6, seed=i, max_tokens=n, ignore_eos=True)
                         for i in range(len(prompts))],
        "unseeded T=0.6": [SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True)] * len(prompts),
        "greedy": [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)] * len(prompts)}
    plain: dict[str, list[list[int]]] = {}
    report = {}
    for name in engines:
        report[name] = run_engine(SPECS[name], workloads, prompts, plain, args.enforce_eager, args.dtype)
        print(name, json.dumps(report[name]), flush=True)
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                       "new_tokens": n, "dtype": args.dtype, "engines": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where tree drafts fail on a GPU (issue #12): the demo model's tree for itself, greedy and seeded, a few prompts,
with one part of the CUDA-graph path run eagerly (the same functions, no capture), so that under
CUDA_LAUNCH_BLOCKING=1 a device-side error names its op.

    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=. python scripts/tree_gpu_debug.py --mode graphs|eager|eager_loop|eager_verify
"""
from __future__ import annotations

import argparse
import traceback

from lamina import DEMO_DRAFT, DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import BENCH_TREE, PROMPT_SETS
from lamina.graphs import EagerGraph, TorchCUDAGraph
from lamina.spec.tree_loop import TreeLoop
from lamina.worker.cuda_graphs import CudaGraphRunner


def run_eagerly(cls: type) -> None:
    """cls's constructor captures with EagerGraph by default (debugging only)."""
    cls.__init__.__defaults__ = tuple(EagerGraph if d is TorchCUDAGraph else d for d in cls.__init__.__defaults__)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["graphs", "eager", "eager_loop", "eager_verify"], default="graphs")
    parser.add_argument("--draft", choices=["self", "draft"], default="self")
    parser.add_argument("--num-prompts", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    if args.mode == "eager_loop":
        run_eagerly(TreeLoop)
    if args.mode == "eager_verify":
        run_eagerly(CudaGraphRunner)
    spec = {"method": "draft_model", "model": DEMO_MODEL if args.draft == "self" else DEMO_DRAFT,
            "speculative_token_tree": BENCH_TREE, "adaptive": False}
    llm = LLM(DEMO_MODEL, speculative_config=spec, enforce_eager=args.mode == "eager")
    prompts = [p for ps in PROMPT_SETS.values() for p in ps][:args.num_prompts]
    for label, params in [("greedy", SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)),
                          ("seeded", SamplingParams(temperature=0.6, seed=1, max_tokens=args.new_tokens,
                                                    ignore_eos=True))]:
        try:
            outs = llm.generate(prompts, params, use_tqdm=False)
            stats = llm.engine.get_stats().spec
            print(f"{args.mode} {label}: ok, {stats.num_draft_tokens} drafted, {stats.num_accepted_tokens} accepted;"
                  f" first text {outs[0].outputs[0].text[:60]!r}", flush=True)
        except Exception:  # noqa: BLE001 - the point is the traceback
            print(f"{args.mode} {label}: FAILED", flush=True)
            traceback.print_exc()
            return 1
    llm.engine.check_integrity()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

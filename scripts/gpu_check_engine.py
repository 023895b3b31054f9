"""The engine half of scripts/gpu_check.py (`--engine`): the demo model's greedy tokens with CUDA graphs against
enforce_eager, then W2 qwen3-0.6b decode with graphs and eagerly. `--dry-run`: the same on CPU (EagerGraph stands
in, tiny W2). Prints a table last; writes $OUT/gpu_check_engine.json when OUT is set.

    python scripts/gpu_check.py --engine [--dry-run]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_check import print_table  # noqa: E402 - scripts/ is on sys.path when a script there runs


def graph_vs_eager(device: str) -> dict[str, Any]:
    """The demo model's greedy tokens with decode graphs and eagerly (on CPU: EagerGraph stands in)."""
    import torch

    from lamina import DEMO_MODEL, LLM, SamplingParams
    from lamina.bench.offline import release_memory
    from lamina.bench.w6_cpu import PROMPTS
    from lamina.graphs import EagerGraph
    from lamina.worker.cuda_graphs import CudaGraphRunner
    # the interpreter (CPU) is slow: 4 prompts x 6 tokens there
    prompts = PROMPTS if device == "cuda" else PROMPTS[:4]
    params = SamplingParams(temperature=0, max_tokens=32 if device == "cuda" else 6, ignore_eos=True)
    tokens, used_graphs = {}, False
    for eager in (True, False):
        release_memory()
        llm = LLM(model=DEMO_MODEL, dtype="bfloat16" if device == "cuda" else "float32", device=device,
                  attention_backend="triton", enforce_eager=eager, max_num_seqs=32)
        runner = llm.engine.executor.worker.runner
        if device == "cpu" and not eager:
            w = llm.engine.executor.worker
            runner.graphs = CudaGraphRunner(w.model, 16, w.max_model_len, w.config.cache_config.block_size,
                                            torch.device("cpu"), graph_cls=EagerGraph)
            runner.graphs.capture_all()
        used_graphs = used_graphs or runner.graphs is not None
        tokens[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        del llm, runner
    same = sum(a == b for a, b in zip(tokens[True], tokens[False]))
    prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(*tokens.values())]
    return dict(workload="demo greedy: graphs vs eager", exact_match=f"{same}/{len(prompts)}",
                min_common_prefix=min(prefix), graphs_used=used_graphs, ok=used_graphs and same >= len(prompts) - 2)


def engine_section(dry_run: bool) -> list[dict[str, Any]]:
    from lamina.bench.offline import parse_args, run_w2, write_config
    import tempfile
    rows = [graph_vs_eager("cpu" if dry_run else "cuda")]
    args = parse_args(["--workload", "w2", "--shape", "qwen3-0.6b"] + (["--dry-run"] if dry_run else []))
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(args.shape, tmp)
        for eager in (False, True):
            row = run_w2(config, args, enforce_eager=eager)
            rows.append(dict(workload=f"W2 {args.shape} {'eager' if eager else 'graphs'}", ok=True, **row))
    return rows


def engine_main(dry_run: bool) -> int:
    if dry_run:
        import tests.kernels.conftest  # noqa: F401 - TRITON_INTERPRET=1 (+ interpreter fixes) first
    import torch
    if not dry_run and not torch.cuda.is_available():
        print("no CUDA device: use --engine --dry-run")
        return 2
    rows = engine_section(dry_run)
    report = dict(torch=torch.__version__, device=torch.cuda.get_device_name() if not dry_run else "cpu", engine=rows)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check_engine.json").write_text(json.dumps(report, indent=1))
    print(f"\n{report['device']}, torch {report['torch']}")
    print_table(rows, ["workload", "ok", "exact_match", "min_common_prefix", "graphs_used", "cuda_graphs",
                       "decode_tok_per_s", "ceiling_frac", "startup_s", "startup_to_first_token_s",
                       "kv_capacity_tokens"])
    return 0 if all(r["ok"] for r in rows) else 1

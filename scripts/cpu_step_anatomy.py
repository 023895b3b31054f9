"""Where a CPU forward of one decode token goes, module by module, and what its matmuls cost by path (issue #12).

    PYTHONPATH=. python scripts/cpu_step_anatomy.py [--model DIR] [--position 150] [--steps 300] [--result-file F]

A one-token forward at `position` (a 1-sequence decode batch of lamina's torch attention path, no engine) timed
bare, then with a timer around every module (inclusive times, so a module's time holds its children's). Then
the model's linear weights, in the order a step reads them, multiplied by one row of x: F.linear (MKL's GEMV),
lamina's weight-major GEMM (small_batch_matmul's CPU path) and numpy's BLAS (x @ W.T, no copy of W), each over
every weight once per pass, so that a model larger than the L3 streams its weights as a step does.
"""
from __future__ import annotations

import argparse
import collections
import json
import time

import torch
import torch.nn.functional as F

from lamina import DEMO_MODEL
from lamina.attention.metadata import AttentionMetadata, set_attention_metadata
from lamina.kv.cache import allocate_kv_caches, bind_kv_caches
from lamina.layers.cpu_matmul import weight_major_matmul
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model

BLOCK_SIZE = 16


def decode_metadata(position: int) -> AttentionMetadata:
    blocks = position // BLOCK_SIZE + 1
    return AttentionMetadata(
        slot_mapping=torch.tensor([position]), query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens=torch.tensor([position + 1], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32).view(1, blocks), max_query_len=1,
        max_seq_len=position + 1, query_start_loc_cpu=[0, 1], seq_lens_cpu=[position + 1])


def warm_up_calls(steps: int) -> int:
    return max(1, steps // 10)


def timed(fn, steps: int) -> float:  # noqa: ANN001
    """Mean ms of fn() over `steps` calls, after warm_up_calls(steps) unmeasured ones."""
    for _ in range(warm_up_calls(steps)):
        fn()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return 1000 * (time.perf_counter() - start) / steps


def by_module(model: torch.nn.Module, step, steps: int) -> dict[str, float]:  # noqa: ANN001
    """Inclusive ms a step per module class, with a timer hooked around every module (removed afterwards)."""
    totals: dict[str, float] = collections.defaultdict(float)
    started: dict[int, float] = {}
    hooks = []
    for module in model.modules():
        name = type(module).__name__
        hooks.append(module.register_forward_pre_hook(lambda m, args: started.__setitem__(id(m), time.perf_counter())))
        hooks.append(module.register_forward_hook(
            lambda m, args, out, name=name: totals.__setitem__(name, totals[name] + time.perf_counter()
                                                                 - started[id(m)])))
    timed(step, steps)
    for hook in hooks:
        hook.remove()
    calls = steps + warm_up_calls(steps)  # the hooks saw the warm-up calls too
    return {name: 1000 * total / calls for name, total in sorted(totals.items(), key=lambda t: -t[1])}


def matmul_paths(model: torch.nn.Module, steps: int) -> dict[str, float]:
    """ms a pass over every linear weight of the model (and its LM head) with one row of x, by path."""
    weights = [p.detach() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name]
    if model.arch.tie_word_embeddings:
        weights.append(model.lm_head.weight.detach())
    rows = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
    arrays = [(rows[w.shape[1]].numpy(), w.numpy().T) for w in weights]
    return {"f_linear": timed(lambda: [F.linear(rows[w.shape[1]], w) for w in weights], steps),
            "weight_major": timed(lambda: [weight_major_matmul(rows[w.shape[1]], w) for w in weights], steps),
            "numpy": timed(lambda: [x @ wt for x, wt in arrays], steps),
            "weight_MB": sum(w.numel() * w.element_size() for w in weights) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--position", type=int, default=150)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args()
    arch = load_model_arch(args.model)
    model = load_model(args.model, arch, torch.float32, torch.device("cpu"), attention_backend="torch")
    blocks = args.position // BLOCK_SIZE + 1
    bind_kv_caches(model, allocate_kv_caches(arch, blocks, BLOCK_SIZE, torch.float32, torch.device("cpu")))
    ids, positions = torch.tensor([5]), torch.tensor([args.position])
    with torch.inference_mode(), set_attention_metadata(decode_metadata(args.position)):
        step = lambda: model.compute_logits(model(ids, positions))  # noqa: E731
        report = {"model": args.model, "threads": torch.get_num_threads(), "forward_ms": timed(step, args.steps),
                  "matmuls_ms": matmul_paths(model, args.steps // 3), "modules_ms": by_module(model, step, args.steps)}
    print(f"forward + logits: {report['forward_ms']:.3f} ms ({report['threads']} threads)")
    print("one row through every weight ({weight_MB:.1f} MB): F.linear {f_linear:.3f} ms, weight-major "
          "{weight_major:.3f} ms, numpy {numpy:.3f} ms".format(**report["matmuls_ms"]))
    print("by module (inclusive, with the hooks' own cost):")
    for name, ms in report["modules_ms"].items():
        print(f"  {name:28s} {ms:7.3f} ms")
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

"""Quantized models in CUDA graphs and with the prefix cache (issue #13: "CUDA graphs and the prefix cache work
unchanged on quantized models"), on a GPU.

    python scripts/quant_graphs_check.py [--methods int8,rtn4,fp8] [--result-file FILE]

The demo model quantized by each method (and unquantized, as the control), run by lamina's engine in bf16 with
greedy sampling, three ways: with CUDA graphs (the default), eagerly (enforce_eager), and with graphs a second time
in the same engine, whose prompts are then all in the prefix cache. Prints, per method, how many of the outputs
are identical between the ways and the share of equal tokens, the prefix cache's hits on the second pass, and
writes JSON to --result-file, or to $OUT/quant_graphs_check.json when OUT is set. Graphs and eager steps run the
same kernels for a decode step; a prompt chunk replayed in a graph is padded to its bucket's rows, where the
quantized matmul may take another kernel than eagerly (lamina.quant.wna16), so near-ties may flip a token there.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from quant_w8a8_gpu_check import PROMPTS, _agreement, _quantize, _table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lamina import DEMO_MODEL, LLM, SamplingParams  # noqa: E402

HEADER = "# utilities for the build scripts of the project, kept in one module\nimport os\nimport sys\n\n"
NEW_TOKENS = 48


def _runs(model: str, device: str) -> dict:
    """Greedy tokens of PROMPTS (each after HEADER): with graphs, twice in one engine (the second pass from the
    prefix cache), and eagerly; the second pass's prefix-cache hit rate."""
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    prompts = [HEADER + p for p in PROMPTS]
    out: dict = {}
    for name, kwargs in (("graphs", {}), ("eager", {"enforce_eager": True})):
        llm = LLM(model=model, device=device, dtype="bfloat16", gpu_memory_utilization=0.3, **kwargs)
        out[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        if name == "graphs":
            before = llm.engine.get_stats().snapshot()
            out["cached"] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
            after = llm.engine.get_stats()
            queries = after.prefix_cache_queries - before.prefix_cache_queries
            out["hit_rate"] = (after.prefix_cache_hits - before.prefix_cache_hits) / max(1, queries)
        llm.engine.check_integrity()
        del llm
        torch.cuda.empty_cache()
    return out


def _row(method: str, runs: dict, base: dict | None) -> dict:
    row = {"method": method,
           "graphs=eager outputs": sum(a == b for a, b in zip(runs["graphs"], runs["eager"])),
           "graphs=eager tokens": _agreement(runs["graphs"], runs["eager"]),
           "cached=fresh outputs": sum(a == b for a, b in zip(runs["cached"], runs["graphs"])),
           "cached=fresh tokens": _agreement(runs["cached"], runs["graphs"]),
           "cache hit rate": runs["hit_rate"]}
    if base is not None:
        row["tokens as bf16's"] = _agreement(runs["graphs"], base["graphs"])
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="int8,rtn4,fp8", help="comma-separated quantization methods")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--result-file")
    args = parser.parse_args()
    base = _runs(DEMO_MODEL, args.device)
    rows = [_row("bf16 (unquantized)", base, None)]
    with tempfile.TemporaryDirectory() as work:
        for method in args.methods.split(","):
            path = str(Path(work) / method)
            _quantize(method, path)
            rows.append(_row(method, _runs(path, args.device), base))
    report = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "prompts": len(PROMPTS), "new_tokens": NEW_TOKENS, "rows": rows}
    print(f"{len(PROMPTS)} prompts x {NEW_TOKENS} greedy tokens on {report['device']}")
    print(_table(rows))
    result = args.result_file or (os.path.join(os.environ["OUT"], "quant_graphs_check.json")
                                  if "OUT" in os.environ else None)
    if result:
        Path(result).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

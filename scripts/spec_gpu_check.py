"""Speculative decoding on a GPU: is it exact there? (issue #12)

    python scripts/spec_gpu_check.py [--methods ngram,draft_model,medusa,early_exit,eagle] [--result-file out.json]

1. The rejection sampler on CUDA tensors: 200,000 rows verifying one n-gram (one-hot) draft against a known
   target distribution (temperature 0.8, top-k 6 of 8): the first emitted token's histogram vs the exact target
   distribution, chi-square; greedy rows keep drafts exactly while they equal the argmax.
2. Greedy identity on the demo model in bf16 with CUDA graphs: the 24 bench prompts, 128 tokens each, with each
   method against no speculation; the share of identical outputs and where the first ones differ (a verify step
   runs k + 1 positions a request through other kernel shapes than a decode: a near-tie may round differently).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from scipy.stats import chisquare

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import PROMPT_SETS, spec_config
from lamina.layers.rejection_sampler import RejectionSampler
from lamina.layers.sampling_metadata import SamplingMetadata


def rejection_sampler_on(device: torch.device, rows: int = 200_000) -> dict:
    logits_row = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    params = SamplingParams(temperature=0.8, top_k=6)
    target = torch.softmax(logits_row / 0.8, 0)
    target[6:] = 0
    target /= target.sum()
    logits = logits_row.repeat(2 * rows, 1).to(device)  # k = 1: two rows a request
    drafts = torch.full((rows,), 1, dtype=torch.int64, device=device)  # always draft token 1
    md = SamplingMetadata.build([params] * rows, 8, device)
    out = RejectionSampler(generator=torch.Generator(device).manual_seed(0))(logits, [1] * rows, drafts, md)
    first = out.token_ids[:, 0].cpu()
    observed = torch.bincount(first, minlength=8).double()
    keep = target > 0
    expected = target.double() / target.double()[keep].sum() * observed[keep].sum()
    stat, p_value = chisquare(observed[keep].numpy(), expected[keep].numpy())
    greedy = SamplingMetadata.build([SamplingParams(temperature=0)] * 2, 8, device)
    two = torch.tensor([[0.0, 3.0, 1, 0, 0, 0, 0, 0], [0.0, 0, 0, 5.0, 0, 0, 0, 0]] * 2, device=device)
    greedy_out = RejectionSampler()(two, [1, 1], torch.tensor([1, 2], device=device), greedy).token_ids.cpu()
    return {"rows": rows, "chi2": float(stat), "p_value": float(p_value),
            "outside_top_k": int(observed[~keep].sum()), "greedy": greedy_out.tolist(),
            "greedy_ok": greedy_out.tolist() == [[1, 3], [1, -1]]}


def greedy_identity(methods: list[str], new_tokens: int) -> dict:
    prompts = [p for ps in PROMPT_SETS.values() for p in ps]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    outputs = {}
    for label in ["off", *methods]:
        config = None if label == "off" else spec_config(label)
        llm = LLM(model=DEMO_MODEL, speculative_config=config, gpu_memory_utilization=0.6)
        outputs[label] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        llm.engine.check_integrity()
        llm.engine.executor.shutdown()
        del llm
        torch.cuda.empty_cache()
    report = {}
    for label in methods:
        same = [a == b for a, b in zip(outputs[label], outputs["off"])]
        first_diff = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                      for a, b in zip(outputs[label], outputs["off"])]
        report[label] = {"identical": sum(same), "of": len(same), "first_difference_at": first_diff}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="ngram,draft_model,medusa,early_exit,eagle")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--result-file")
    args = parser.parse_args(argv)
    report = {"device": torch.cuda.get_device_name(), "rejection_sampler": rejection_sampler_on(torch.device("cuda")),
              "greedy_identity": greedy_identity([m for m in args.methods.split(",") if m], args.new_tokens)}
    rs = report["rejection_sampler"]
    print(f"rejection sampler on CUDA: chi2 {rs['chi2']:.1f}, p {rs['p_value']:.3f}, outside top-k "
          f"{rs['outside_top_k']}, greedy ok {rs['greedy_ok']}")
    for label, r in report["greedy_identity"].items():
        print(f"greedy identity {label}: {r['identical']}/{r['of']} identical; first differences at "
              f"{[d for d in r['first_difference_at'] if d is not None]}")
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

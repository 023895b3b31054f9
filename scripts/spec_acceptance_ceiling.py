"""The acceptance a perfect greedy drafter would reach at temperature 0.6, and what lamina's drafters reach (#12).

    PYTHONPATH=. python scripts/spec_acceptance_ceiling.py [--model DIR] [--draft-model DIR] [--eagle-model DIR]
                                                          [--exit-layer L] [--new-tokens 128] [--result-file F]

Under the verify step's rule a one-hot draft t is accepted with probability p_T(t), the target's own probability of
t at the request's temperature; no argmax drafter does better than the target's argmax, accepted with
p_T(argmax). This generates the spec bench's prompts (lamina.bench.spec.PROMPT_SETS) with lamina at T = 0.6 and
greedily (seed 1), scores every generated position with HF transformers (float32), and reports per prompt set the
mean p_0.6(argmax) and the expected accepted drafts of a k-chain of argmax drafts, E[sum_j prod_{i <= j} p_i], for
k = 1, 3, 5, 7: the ceiling that a trained drafter's acceptance is measured against.

Each drafter given (--draft-model DIR: a checkpoint with the target's vocabulary, e.g. lamina.DEMO_DRAFT;
--eagle-model DIR: an EAGLE head, its first draft; --exit-layer L: the target's first L layers, its norm and LM
head) adds, at the same positions of the T = 0.6 texts, the chance its draft is accepted when drawn from its q at
the request's temperature times c (lamina/spec/draft_sampling.py: with the verify row's noise,
coupled_acceptance), for c = 0 (the argmax: p_T(argmax q)), 0.5 and 1, and Leviathan et al.'s sum_t min(p_T, q_T)
at c = 1 for reference.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch

from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import PROMPT_SETS
from lamina.spec.draft_sampling import coupled_acceptance

TEMPERATURE, CHAINS, SCALES = 0.6, (1, 3, 5, 7), (0.5, 1.0)


@dataclass
class Scored:
    """One generated text under the target (HF, float32), scored once for every use below."""

    ids: torch.Tensor  # [1, len]: prompt + output
    n: int  # the prompt's length
    p: torch.Tensor  # [len - n, V]: p_T at each generated position (the distribution before each output token)
    hidden: tuple[torch.Tensor, ...]  # the target's hidden states (HF's output_hidden_states)


def score(hf: torch.nn.Module, prompt: list[int], output: list[int]) -> Scored:
    ids, n = torch.tensor([prompt + output]), len(prompt)
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
    return Scored(ids, n, (out.logits[0, n - 1:-1].float() / TEMPERATURE).softmax(-1), out.hidden_states)


def drafter_logits(name: str, drafter: object, hf: torch.nn.Module, text: Scored) -> torch.Tensor:
    """The drafter's logits of the tokens at positions n .. len - 1 of the text."""
    ids, n = text.ids, text.n
    with torch.no_grad():
        if name == "draft model":
            return drafter(ids).logits[0, n - 1:-1].float()
        if name == "early exit":
            return hf.lm_head(hf.model.norm(text.hidden[drafter][0, n - 1:-1])).float()
        from lamina.distill.eagle_ttt import unroll  # EAGLE: base b feeds token b + 1 and predicts token b + 2
        features = torch.cat([text.hidden[i] for i in drafter.cfg.aux_hidden_state_layers], -1)[:, :-1]
        normed = unroll(drafter, hf.model.embed_tokens, features, [ids[:, 1:]])[0][0]
        return torch.nn.functional.linear(normed[n - 2:-1], hf.lm_head.weight).float()


def drafter_acceptance(name: str, drafter: object, hf: torch.nn.Module, text: Scored) -> dict[str, torch.Tensor]:
    """Per generated position: the acceptance of the drafter's draft at each c, and Leviathan's at c = 1."""
    p, z = text.p, drafter_logits(name, drafter, hf, text)
    out = {"c=0": p.gather(1, z.argmax(-1, keepdim=True))[:, 0]}
    for c in SCALES:
        out[f"c={c}"] = coupled_acceptance(p, (z / (c * TEMPERATURE)).softmax(-1))
    out["leviathan c=1"] = torch.minimum(p, (z / TEMPERATURE).softmax(-1)).sum(-1)
    return out


def expected_accepted(p: torch.Tensor, k: int) -> float:
    """Mean over start positions of the expected accepted length of k argmax drafts."""
    starts = range(len(p) - k + 1)
    return sum(p[i:i + k].cumprod(0).sum().item() for i in starts) / max(len(starts), 1)


def load_drafters(args: argparse.Namespace) -> dict[str, object]:
    from transformers import AutoModelForCausalLM
    drafters: dict[str, object] = {}
    if args.draft_model:
        drafters["draft model"] = AutoModelForCausalLM.from_pretrained(args.draft_model, dtype=torch.float32).eval()
    if args.eagle_model:
        from lamina.spec.eagle import load_head
        drafters["EAGLE head"] = load_head(args.eagle_model)[0]
    if args.exit_layer:
        drafters["early exit"] = args.exit_layer
    return drafters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--draft-model", default=None)
    parser.add_argument("--eagle-model", default=None)
    parser.add_argument("--exit-layer", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    drafters = load_drafters(args)
    llm = LLM(args.model, device="cpu", dtype="float32")
    rows = {}
    for name, prompts in PROMPT_SETS.items():
        for temperature in (TEMPERATURE, 0.0):
            params = SamplingParams(temperature=temperature, max_tokens=args.new_tokens, seed=1, ignore_eos=True)
            outs = llm.generate(prompts, params, use_tqdm=False)
            texts = [score(hf, list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outs]
            probs = [text.p.max(-1).values for text in texts]
            row = rows[f"{name}, T={temperature} text"] = {
                "positions": sum(len(p) for p in probs),
                "mean_p_argmax": round(torch.cat(probs).mean().item(), 3),
                **{f"expected_accepted_k{k}": round(sum(expected_accepted(p, k) for p in probs) / len(probs), 2)
                   for k in CHAINS}}
            if temperature == 0:
                continue
            for drafter_name, drafter in drafters.items():
                per_text = [drafter_acceptance(drafter_name, drafter, hf, text) for text in texts]
                row[drafter_name] = {key: round(torch.cat([a[key] for a in per_text]).mean().item(), 3)
                                     for key in per_text[0]}
    llm.engine.check_integrity()
    print(f"{'text':<22} {'p0.6(argmax)':>12} " + " ".join(f"{'E acc k=' + str(k):>9}" for k in CHAINS))
    for key, row in rows.items():
        print(f"{key:<22} {row['mean_p_argmax']:>12} "
              + " ".join(f"{row[f'expected_accepted_k{k}']:>9}" for k in CHAINS))
    for key, row in rows.items():
        for drafter_name in (d for d in drafters if d in row):
            print(f"{key:<22} {drafter_name}: " + ", ".join(f"{k} {v}" for k, v in row[drafter_name].items()))
    report = {"model": args.model, "drafters": {"draft_model": args.draft_model, "eagle_model": args.eagle_model,
                                                "exit_layer": args.exit_layer},
              "temperature_of_acceptance": TEMPERATURE, "new_tokens": args.new_tokens, "rows": rows}
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

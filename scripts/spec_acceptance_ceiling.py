"""The acceptance a perfect greedy drafter would reach at temperature 0.6 (issue #12).

    PYTHONPATH=. python scripts/spec_acceptance_ceiling.py [--model DIR] [--draft-model DIR] [--new-tokens 128]
                                                          [--result-file out.json]

lamina's drafts are one-hot proposals: under the verify step's rule (accept with min(1, p / q)) a draft token t
is accepted with probability p_T(t), the target's own probability of t at the request's temperature. No drafter
does better than the target's argmax, accepted with p_T(argmax). This generates the spec bench's prompts
(lamina.bench.spec.PROMPT_SETS) with lamina at T = 0.6 and greedily (seed 1), scores every generated position
with HF transformers (float32), and reports per prompt set the mean p_0.6(argmax) and the expected accepted
drafts of a k-chain of argmax drafts, E[sum_j prod_{i <= j} p_i], for k = 1, 3, 5, 7: the ceiling that a trained
drafter's acceptance is measured against.

--draft-model DIR (a checkpoint with the target's vocabulary, e.g. lamina.DEMO_DRAFT) adds, at the same positions,
what that model's drafts would be accepted with: p_T(argmax q) for its greedy (one-hot) drafts, as lamina drafts
today, and sum_t min(p_T(t), q_T(t)) for drafts sampled from its own distribution q at the same temperature
(Leviathan et al.'s rule with q; the sampled rows only, since greedy requests draft greedily either way).
"""
from __future__ import annotations

import argparse
import json

import torch

from lamina import DEMO_MODEL, LLM, SamplingParams
from lamina.bench.spec import PROMPT_SETS

TEMPERATURE, CHAINS = 0.6, (1, 3, 5, 7)


def argmax_probs(model: torch.nn.Module, prompt: list[int], output: list[int]) -> torch.Tensor:
    """p_T(argmax) at each generated position (the target's distribution before each output token)."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / TEMPERATURE
    return logits.softmax(-1).max(-1).values


def draft_acceptance(target: torch.nn.Module, draft: torch.nn.Module, prompt: list[int], output: list[int]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per generated position: p_T(argmax q) (greedy drafts) and sum min(p_T, q_T) (drafts sampled from q_T)."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        p = (target(ids).logits[0, len(prompt) - 1:-1].float() / TEMPERATURE).softmax(-1)
        q_logits = draft(ids).logits[0, len(prompt) - 1:-1].float()
    greedy = p.gather(1, q_logits.argmax(-1, keepdim=True))[:, 0]
    return greedy, torch.minimum(p, (q_logits / TEMPERATURE).softmax(-1)).sum(-1)


def expected_accepted(p: torch.Tensor, k: int) -> float:
    """Mean over start positions of the expected accepted length of k argmax drafts."""
    starts = range(len(p) - k + 1)
    return sum(p[i:i + k].cumprod(0).sum().item() for i in starts) / max(len(starts), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--draft-model", default=None)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--result-file", default=None)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    draft = None if args.draft_model is None else AutoModelForCausalLM.from_pretrained(
        args.draft_model, dtype=torch.float32).eval()
    llm = LLM(args.model, device="cpu", dtype="float32")
    rows = {}
    for name, prompts in PROMPT_SETS.items():
        for temperature in (TEMPERATURE, 0.0):
            params = SamplingParams(temperature=temperature, max_tokens=args.new_tokens, seed=1, ignore_eos=True)
            outs = llm.generate(prompts, params, use_tqdm=False)
            probs = [argmax_probs(hf, list(o.prompt_token_ids), list(o.outputs[0].token_ids)) for o in outs]
            rows[f"{name}, T={temperature} text"] = {
                "positions": sum(len(p) for p in probs),
                "mean_p_argmax": round(torch.cat(probs).mean().item(), 3),
                **{f"expected_accepted_k{k}": round(sum(expected_accepted(p, k) for p in probs) / len(probs), 2)
                   for k in CHAINS}}
            if draft is not None and temperature > 0:
                pairs = [draft_acceptance(hf, draft, list(o.prompt_token_ids), list(o.outputs[0].token_ids))
                         for o in outs]
                rows[f"{name}, T={temperature} text"].update(
                    draft_greedy=round(torch.cat([g for g, _ in pairs]).mean().item(), 3),
                    draft_sampled=round(torch.cat([m for _, m in pairs]).mean().item(), 3))
    llm.engine.check_integrity()
    print(f"{'text':<22} {'p0.6(argmax)':>12} " + " ".join(f"{'E acc k=' + str(k):>9}" for k in CHAINS))
    for key, row in rows.items():
        print(f"{key:<22} {row['mean_p_argmax']:>12} "
              + " ".join(f"{row[f'expected_accepted_k{k}']:>9}" for k in CHAINS))
    for key, row in rows.items():
        if "draft_greedy" in row:
            print(f"{key:<22} draft model's drafts accepted: greedy {row['draft_greedy']}, "
                  f"sampled {row['draft_sampled']}")
    report = {"model": args.model, "draft_model": args.draft_model, "temperature_of_acceptance": TEMPERATURE,
              "new_tokens": args.new_tokens, "rows": rows}
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""HF transformers as the oracle: greedy continuations computed without any cache."""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM


def load_hf(model_dir: str) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain argmax decoding, recomputing the whole sequence each step (no KV cache to trust)."""
    ids = list(prompt)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@torch.no_grad()
def hf_logprobs(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """log_softmax of the next-token logits at every position of `tokens`."""
    return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)


@torch.no_grad()
def hf_prompt_logprobs(model_dir: str, prompts: list[list[int]]) -> list[list[float]]:
    """Per prompt, the float32 log-probability of each of its tokens after the first, given the ones before."""
    model = load_hf(model_dir)
    out = []
    for ids in prompts:
        logprobs = hf_logprobs(model, ids)
        out.append([logprobs[i, ids[i + 1]].item() for i in range(len(ids) - 1)])
    return out

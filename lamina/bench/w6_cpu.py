"""W6 — the embedded default on CPU: greedy 128 tokens for a batch of 1 and of 16 prompts,
lamina against HF transformers on the same checkpoint, in the same process.

    python -m lamina.bench.w6_cpu [--model DIR] [--result-file out.json]

HF runs `generate` with its default dynamic KV cache, left padding and an attention mask; both
sides run float32 on the same threads. A progress bar on stderr counts every generated token; at the end
it prints a table and writes JSON.
"""
from __future__ import annotations

import sys
import time

import torch

from lamina import LLM, SamplingParams
from lamina.bench.cpu_report import cpu_bench_parser, run_info, write_report

PROMPTS = [
    "def fibonacci(n):", "import os\n", "class Stack:\n    def __init__(self):", "def quicksort(xs):",
    "# Read a CSV file and", "def is_prime(n):", "for i in range(", "with open(path) as f:",
    "def parse_args():\n    parser = argparse.ArgumentParser(", "try:\n    import numpy as np\nexcept",
    "def __repr__(self):", "async def fetch(url):", "@dataclass\nclass Point:", "def merge(a, b):",
    "if __name__ == \"__main__\":", "def binary_search(xs, target):",
]


class Progress:
    """One tqdm bar over every token the benchmark generates (warm-ups included), on stderr.

    lamina's runs advance it when they finish; HF's advance it as generate streams each step (its
    streamer's first call is the prompt), so minutes of HF decoding show as they happen.
    """

    def __init__(self, total: int, disable: bool = False) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="W6", unit="tok", disable=disable)

    def stage(self, name: str) -> None:
        self.bar.set_description(f"W6 {name}")

    def advance(self, tokens: int) -> None:
        self.bar.update(tokens)

    def close(self) -> None:
        self.bar.close()


class _StepCounter:
    """A generate streamer that advances the progress bar by the batch size for every decoded step."""

    def __init__(self, progress: Progress, batch: int) -> None:
        self.progress, self.batch, self.prompt_seen = progress, batch, False

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:
            self.progress.advance(self.batch)
        self.prompt_seen = True

    def end(self) -> None:
        pass


def time_lamina(llm: LLM, prompt_ids: list[list[int]], new_tokens: int, progress: Progress) -> float:
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == new_tokens for o in outs)
    progress.advance(len(prompt_ids) * new_tokens)
    return elapsed


@torch.inference_mode()
def time_hf(model: torch.nn.Module, prompt_ids: list[list[int]], new_tokens: int, progress: Progress) -> float:
    width = max(len(p) for p in prompt_ids)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    streamer = _StepCounter(progress, len(prompt_ids))
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, streamer=streamer)
    elapsed = time.perf_counter() - start
    assert out.shape[1] == width + new_tokens
    return elapsed


BATCHES = (1, 16)
WARM_UP = (2, 8)  # prompts, tokens


def total_tokens(new_tokens: int, repeats: int) -> int:
    """Every token both sides generate: the warm-ups, then `repeats` runs of each batch."""
    return 2 * (WARM_UP[0] * WARM_UP[1] + repeats * sum(BATCHES) * new_tokens)


def run(model_dir: str, new_tokens: int, repeats: int, disable_progress: bool = False) -> dict:
    from transformers import AutoModelForCausalLM

    progress = Progress(total_tokens(new_tokens, repeats), disable_progress)
    progress.stage("loading")
    llm = LLM(model=model_dir)
    tokenizer = llm.get_tokenizer()
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    progress.stage("warm-up")
    time_lamina(llm, prompt_ids[:WARM_UP[0]], WARM_UP[1], progress)
    time_hf(hf, prompt_ids[:WARM_UP[0]], WARM_UP[1], progress)
    rows = []
    for batch in BATCHES:
        prompts = prompt_ids[:batch]
        progress.stage(f"lamina, batch {batch}")
        lamina_s = min(time_lamina(llm, prompts, new_tokens, progress) for _ in range(repeats))
        progress.stage(f"HF, batch {batch}")
        hf_s = min(time_hf(hf, prompts, new_tokens, progress) for _ in range(repeats))
        tokens = batch * new_tokens
        rows.append({"batch": batch, "output_tokens": tokens, "lamina_tok_s": tokens / lamina_s,
                     "hf_tok_s": tokens / hf_s, "speedup": hf_s / lamina_s})
    progress.close()
    llm.engine.check_integrity()
    return {"workload": "W6", "model": model_dir, "new_tokens": new_tokens, "repeats": repeats, **run_info(),
            "peer": "HF transformers generate (dynamic cache, fp32)", "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = cpu_bench_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="best of N runs per side")
    args = parser.parse_args(argv)
    result = run(args.model, args.new_tokens, args.repeats, args.disable_tqdm)
    print(f"{'batch':>5} {'lamina tok/s':>13} {'HF tok/s':>9} {'speedup':>8}")
    for row in result["rows"]:
        print(f"{row['batch']:>5} {row['lamina_tok_s']:>13.1f} {row['hf_tok_s']:>9.1f} {row['speedup']:>7.2f}x")
    write_report(args.result_file, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The accuracy gate's measurements, with lamina's own model forward (torch, the reference attention path):
perplexity on held-out text, and against a baseline model the mean KL divergence of the next-token
distributions and the top-1 agreement.

Each document is cut into windows of `window` tokens scored independently (the first token of a window
has no context and is not scored):  ppl = exp(mean NLL),  KL = mean_t KL(p_base(.|t) || p_model(.|t)).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from lamina.attention.layer import FP8_KV_DTYPE
from lamina.attention.metadata import prefill_metadata, set_attention_metadata
from lamina.kv.cache import allocate_kv_caches, bind_kv_caches
from lamina.loader.hf_config import load_model_arch
from lamina.loader.model_loader import load_model
from lamina.loader.tokenizer import Tokenizer
from lamina.models.common import CausalLM
from lamina.quant.config import parse_quant_config

DEFAULT_EVAL_TEXT = str(Path(__file__).parent / "data" / "heldout_python.jsonl")
BLOCK_SIZE = 16


@dataclass(frozen=True)
class EvalResult:
    perplexity: float
    tokens: int  # scored tokens
    kl: float | None = None  # mean KL(baseline || model) in nats per token; None without a baseline
    top1_agreement: float | None = None  # fraction of positions with the baseline's argmax
    baseline_perplexity: float | None = None

    @property
    def ppl_increase(self) -> float | None:
        """Relative perplexity increase over the baseline (0.01 = +1 %)."""
        return None if self.baseline_perplexity is None else self.perplexity / self.baseline_perplexity - 1.0


def read_eval_texts(path: str) -> list[str]:
    """Documents of a .jsonl file (each line's "text") or the whole of any other text file."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"eval text: {path!r} is not a file")
    if file.suffix != ".jsonl":
        return [file.read_text()]
    texts = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"eval text {path}: line {number} needs a string 'text' field")
            texts.append(row["text"])
    return texts


def token_windows(texts: list[str], tokenizer: Tokenizer, window: int, max_tokens: int | None) -> list[list[int]]:
    """Windows of at most `window` tokens (at least 2), up to `max_tokens` tokens in all."""
    if window < 2:
        raise ValueError(f"window must be at least 2 tokens, got {window}")
    windows: list[list[int]] = []
    budget = max_tokens if max_tokens is not None else float("inf")
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for start in range(0, len(ids), window):
            chunk = ids[start:start + window][: int(min(window, budget))]
            if len(chunk) >= 2:
                windows.append(chunk)
                budget -= len(chunk)
            if budget <= 0:
                return windows
    return windows


def checkpoint_kv_cache_dtype(model_dir: str) -> str:
    """The kv_cache_dtype a checkpoint is scored with: "fp8" when it carries static fp8 KV scales
    (`kv_cache_scheme`, lamina quantize --kv-cache-scheme), as it runs with them; else "auto"."""
    quant = parse_quant_config(load_model_arch(model_dir).raw.get("quantization_config"))
    return "fp8" if quant is not None and quant.kv_cache_scheme == "fp8" else "auto"


class Scorer:
    """A model with a KV cache for one window at a time: full-window logits from one prefill forward."""

    def __init__(self, model_dir: str, window: int, device: str = "cpu") -> None:
        self.arch = load_model_arch(model_dir)
        if window > self.arch.max_position_embeddings:
            raise ValueError(f"window {window} exceeds the model's max_position_embeddings "
                             f"{self.arch.max_position_embeddings}")
        self.device = torch.device(device)
        self.model: CausalLM = load_model(model_dir, self.arch, torch.float32, self.device, attention_backend="torch")
        self.num_blocks = -(-window // BLOCK_SIZE)
        kv_dtype = FP8_KV_DTYPE if checkpoint_kv_cache_dtype(model_dir) == "fp8" else torch.float32
        caches = allocate_kv_caches(self.arch, self.num_blocks + 1, BLOCK_SIZE, kv_dtype, self.device)
        bind_kv_caches(self.model, caches)

    @torch.inference_mode()
    def log_probs(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), vocab] float32 log-probabilities of the next token after each position."""
        n = len(ids)
        with set_attention_metadata(prefill_metadata([n], BLOCK_SIZE, self.device)):
            hidden = self.model(torch.tensor(ids, device=self.device), torch.arange(n, device=self.device))
        return torch.log_softmax(self.model.compute_logits(hidden), dim=-1)


def evaluate(model_dir: str, windows: list[list[int]], baseline_dir: str | None = None,
             device: str = "cpu") -> EvalResult:
    """Perplexity of `model_dir` on `windows`; with `baseline_dir`, also KL and top-1 agreement against it."""
    if not windows:
        raise ValueError("eval text: no window of at least 2 tokens to score")
    window = max(len(w) for w in windows)
    model = Scorer(model_dir, window, device)
    base = Scorer(baseline_dir, window, device) if baseline_dir else None
    nll = base_nll = kl = agree = 0.0
    count = 0
    for ids in windows:
        logp = model.log_probs(ids)[:-1]
        target = torch.tensor(ids[1:], device=model.device)
        nll += float(-logp.gather(1, target[:, None]).sum())
        count += len(target)
        if base is not None:
            base_logp = base.log_probs(ids)[:-1]
            base_nll += float(-base_logp.gather(1, target[:, None]).sum())
            kl += float((base_logp.exp() * (base_logp - logp)).sum())
            agree += float((base_logp.argmax(-1) == logp.argmax(-1)).sum())
    ppl = float(torch.tensor(nll / count).exp())
    if base is None:
        return EvalResult(ppl, count)
    return EvalResult(ppl, count, kl / count, agree / count, float(torch.tensor(base_nll / count).exp()))

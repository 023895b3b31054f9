"""A real byte-level BPE tokenizer trained in the test, saved HF-style next to a tiny model."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TEXT = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i, 'héllo wörld')\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "日本語のテキスト and emoji 🙂 mixed with ascii text.",
    "The quick brown fox jumps over the lazy dog. " * 3,
]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def save_tiny_tokenizer(model_dir: str | Path, vocab_size: int = 300) -> Tokenizer:
    """Train a byte-level BPE with vocab_size tokens (the model's vocab must be at least that)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 4, trainer)
    model_dir = Path(model_dir)
    tok.save(str(model_dir / "tokenizer.json"))
    config = {"eos_token": "<|endoftext|>", "bos_token": None, "chat_template": CHAT_TEMPLATE,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return tok

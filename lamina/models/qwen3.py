"""Qwen3 (dense): the Llama decoder with an RMSNorm over each q and k head before RoPE."""
from __future__ import annotations

from lamina.models.common import CausalLM


class Qwen3ForCausalLM(CausalLM):
    qk_norm = True

"""Llama (1/2/3.x): the shared decoder as is; RoPE scaling ("linear", "llama3") comes from the config."""
from __future__ import annotations

from lamina.models.common import CausalLM


class LlamaForCausalLM(CausalLM):
    """q/k/v and o_proj biases follow `attention_bias` (false for every released Llama)."""

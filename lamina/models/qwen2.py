"""Qwen2 / Qwen2.5: the Llama decoder with a bias on q/k/v (never on o_proj)."""
from __future__ import annotations

from lamina.models.common import CausalLM


class Qwen2ForCausalLM(CausalLM):
    qkv_bias = True
    o_proj_bias = False

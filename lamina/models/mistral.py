"""Mistral: the Llama decoder, plus a sliding window that lamina does not implement.

Serving is exact as long as max_model_len <= sliding_window (within the window, sliding and full
attention coincide); `lamina.loader.hf_config.check_model_len` refuses anything longer.
"""
from __future__ import annotations

from lamina.models.common import CausalLM


class MistralForCausalLM(CausalLM):
    qkv_bias = False
    o_proj_bias = False

"""The EAGLE-3 head: one Llama decoder layer over the target's fused features and the next token's embedding.

    target features  f = concat(h_low, h_mid, h_high) [3H]  the target's residual stream entering its layers
                                                           `aux_hidden_state_layers` (EAGLE-3: 2, L // 2, L - 3)
    fused            x = fc(f)  [H]                         (a draft step after the first: x = the head's own
                                                           pre-norm output of the previous step, no fc)
    layer            a = attn(concat(input_layernorm(embed(token)), hidden_norm(x)))   qkv: 2H -> q, k, v
                     r = x + o_proj(a);  y = r + mlp(post_attention_layernorm(r))
    output           y (pre-norm: the next step's x), norm(y) -> the target's LM head -> logits

The embedding and the LM head are the target's (reused, not stored). Attention goes through lamina's paged
`Attention` (the head's own KV cache, one layer) inside the engine; `qkv` and `finish` let the trainer
(lamina/distill/eagle.py) run the same weights with its own attention. Tensor names (`fc`, `midlayer.*`,
`norm`) follow vLLM's llama_eagle3 with q/k/v and gate/up fused, as lamina's models do.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lamina.attention.backends import AttentionBackend
from lamina.attention.layer import Attention
from lamina.config import KernelChoice
from lamina.layers.dispatch import DEFAULT_KERNELS
from lamina.layers.linear import DenseLinear
from lamina.layers.norm import RMSNorm
from lamina.layers.rotary import RotaryEmbedding

__all__ = ["EagleHeadConfig", "EagleHead", "default_aux_layers", "read_head_config", "save_head", "CONFIG", "WEIGHTS"]

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
FIELD = "speculative_config.model"
_INT_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
               "vocab_size", "max_position_embeddings")


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low, middle and high layer of a target with `num_layers` layers (clamped into range)."""
    return [min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3)]


@dataclass(frozen=True)
class EagleHeadConfig:
    """The shapes of a head; config.json holds these fields (plus vocab_size, base_model, ...)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    aux_hidden_state_layers: tuple[int, ...]
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048


    def to_dict(self, vocab_size: int, base_model: str | None, **extra: Any) -> dict[str, Any]:
        """config.json of a head directory."""
        out = {"architectures": ["Eagle3Head"], **asdict(self), "vocab_size": vocab_size, "base_model": base_model}
        out["aux_hidden_state_layers"] = list(self.aux_hidden_state_layers)
        return {**out, **extra}


def read_head_config(model_dir: str | Path) -> tuple[EagleHeadConfig, dict[str, Any]]:
    """(shapes, the whole config.json) of a head directory; ValueError naming speculative_config.model."""
    root = Path(model_dir)
    if not (root / CONFIG).is_file() or not (root / WEIGHTS).is_file():
        raise ValueError(f"{FIELD}: {str(model_dir)!r} is not an EAGLE head directory (needs {CONFIG} and "
                         f"{WEIGHTS}, as written by `lamina distill --method eagle`)")
    try:
        raw = json.loads((root / CONFIG).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{FIELD}: {root / CONFIG} is not valid JSON ({err.msg})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{FIELD}: {root / CONFIG} must hold a JSON object")
    for key in _INT_FIELDS:
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{FIELD}: {root / CONFIG} needs {key!r}, an integer >= 1, got {value!r}")
    layers = raw.get("aux_hidden_state_layers")
    if not isinstance(layers, list) or not layers or not all(isinstance(i, int) and i >= 0 for i in layers):
        raise ValueError(f"{FIELD}: {root / CONFIG} needs 'aux_hidden_state_layers', a non-empty list of "
                         f"layer indices >= 0, got {layers!r}")
    cfg = EagleHeadConfig(**{k: raw[k] for k in _INT_FIELDS if k != "vocab_size"},
                          aux_hidden_state_layers=tuple(layers), rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
                          rope_theta=float(raw.get("rope_theta", 10000.0)))
    return cfg, raw


class EagleLayer(nn.Module):
    def __init__(self, cfg: EagleHeadConfig, backend: AttentionBackend | None, kernels: KernelChoice) -> None:
        super().__init__()
        h, d, eps = cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps
        self.q_size, self.kv_size = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
        self.input_layernorm = RMSNorm(h, eps, kernels)
        self.hidden_norm = RMSNorm(h, eps, kernels)
        self.qkv_proj = DenseLinear(2 * h, self.q_size + 2 * self.kv_size, bias=False, kernels=kernels)
        self.o_proj = DenseLinear(self.q_size, h, bias=False, kernels=kernels)
        self.post_attention_layernorm = RMSNorm(h, eps, kernels)
        self.gate_up_proj = DenseLinear(h, 2 * cfg.intermediate_size, bias=False, kernels=kernels)
        self.down_proj = DenseLinear(cfg.intermediate_size, h, bias=False, kernels=kernels)
        self.rotary_emb = RotaryEmbedding(d, cfg.rope_theta, cfg.max_position_embeddings, kernels=kernels)
        self.attn = Attention(cfg.num_attention_heads, cfg.num_key_value_heads, d, d ** -0.5, backend)


class EagleHead(nn.Module):
    """`kernels`: the target's KernelChoice (the head takes the same Triton kernels as its layers)."""

    def __init__(self, cfg: EagleHeadConfig, backend: AttentionBackend | None = None,
                 kernels: KernelChoice = DEFAULT_KERNELS) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = DenseLinear(len(cfg.aux_hidden_state_layers) * cfg.hidden_size, cfg.hidden_size, bias=False,
                              kernels=kernels)
        self.midlayer = EagleLayer(cfg, backend, kernels)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)

    def qkv(self, embeds: torch.Tensor, x: torch.Tensor, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """embeds, x [..., H] (x already fused), positions [...] -> rotated q, k and v (flat heads)."""
        layer = self.midlayer
        both = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(x)], dim=-1)
        q, k, v = layer.qkv_proj(both).split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
        shape_q, shape_k = q.shape, k.shape
        q, k = layer.rotary_emb(positions.reshape(-1), q.reshape(-1, layer.q_size), k.reshape(-1, layer.kv_size))
        return q.reshape(shape_q), k.reshape(shape_k), v

    def finish(self, attn_out: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rest of the layer after attention: (normed output for the LM head, pre-norm output y)."""
        layer = self.midlayer
        hidden, residual = layer.post_attention_layernorm(layer.o_proj(attn_out), x)
        gate, up = layer.gate_up_proj(hidden).chunk(2, dim=-1)
        y = residual + layer.down_proj(F.silu(gate) * up)
        return self.norm(y), y

    def forward(self, embeds: torch.Tensor, x: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """A flat batch through the paged attention (metadata from `set_attention_metadata`): (normed, y)."""
        q, k, v = self.qkv(embeds, x, positions)
        return self.finish(self.midlayer.attn(q, k, v), x)


def save_head(head: EagleHead, out_dir: str | Path, vocab_size: int, base_model: str | None,
              dtype: torch.dtype = torch.bfloat16, **extra: Any) -> None:
    """Write a head directory: config.json and model.safetensors (in `dtype`)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", dtype).contiguous() for name, t in head.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    config = head.cfg.to_dict(vocab_size, base_model, torch_dtype=str(dtype).removeprefix("torch."), **extra)
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")

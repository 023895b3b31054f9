"""The Llama-style decoder shared by every supported architecture.

    input_ids [T] -> embed_tokens -> N x DecoderLayer -> norm -> hidden [T, hidden]
    DecoderLayer:  h, res = input_layernorm(h, res);  h = self_attn(h)      (residual add fused
                   h, res = post_attention_layernorm(h, res);  h = mlp(h)   into the norms)

Module names follow HF's so that a checkpoint name maps to a parameter by one substitution:
q/k/v_proj are fused into `qkv_proj` and gate/up_proj into `gate_up_proj`
(see `CausalLM.stacked_params_mapping`). An architecture subclass states only its differences
through the class attributes below.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from lamina.attention.backends import AttentionBackend
from lamina.attention.layer import Attention
from lamina.config import KernelChoice, ModelArch
from lamina.layers.activation import SiluAndMul
from lamina.layers.dispatch import DEFAULT_KERNELS, pdl_for, qk_norm_rotary_ops
from lamina.layers.embedding import ParallelLMHead, VocabEmbedding
from lamina.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear, QuantMethod, RowParallelLinear,
                                  copy_checked)
from lamina.layers.norm import RMSNorm
from lamina.layers.rotary import RotaryEmbedding
from lamina.models.names import format_names

if TYPE_CHECKING:
    from lamina.quant.config import QuantConfig


def quant_method(quant_config: QuantConfig | None, layer: type, prefix: str) -> QuantMethod | None:
    """The layer's quantization method (None: unquantized); `prefix` is its checkpoint name."""
    return None if quant_config is None else quant_config.get_quant_method(layer, prefix)


KV_SCALE_NAMES = ("self_attn.k_scale", "self_attn.v_scale")  # an fp8 KV cache's per-head scales (optional)


class DecoderAttention(nn.Module):
    """Fused qkv projection (+ optional bias, optional per-head q/k RMSNorm), RoPE, paged attention."""

    def __init__(self, arch: ModelArch, qkv_bias: bool, o_bias: bool, qk_norm: bool,
                 backend: AttentionBackend | None, rotary_emb: RotaryEmbedding, kernels: KernelChoice,
                 quant_config: QuantConfig | None = None, prefix: str = "self_attn") -> None:
        super().__init__()
        head_dim = arch.head_dim
        self.kernels = kernels
        self.qkv_proj = QKVParallelLinear(arch.hidden_size, head_dim, arch.num_attention_heads,
                                          arch.num_key_value_heads, bias=qkv_bias, kernels=kernels,
                                          quant_method=quant_method(quant_config, QKVParallelLinear,
                                                                    f"{prefix}.qkv_proj"))
        self.head_dim = head_dim
        self.q_size = self.qkv_proj.num_heads * head_dim
        self.kv_size = self.qkv_proj.num_kv_heads * head_dim
        self.o_proj = RowParallelLinear(arch.num_attention_heads * head_dim, arch.hidden_size, bias=o_bias,
                                        kernels=kernels,
                                        quant_method=quant_method(quant_config, RowParallelLinear, f"{prefix}.o_proj"))
        self.q_norm = RMSNorm(head_dim, arch.rms_norm_eps, kernels) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, arch.rms_norm_eps, kernels) if qk_norm else None
        self.rotary_emb = rotary_emb  # one table shared by every layer
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, head_dim,
                              scale=head_dim ** -0.5, backend=backend)

    def _head_norm(self, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return norm(x.reshape(x.shape[0], -1, self.head_dim)).reshape(x.shape)

    def _norm_and_rotate(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Optional per-head q/k RMSNorm, then RoPE; on CUDA both in one fused kernel (in place)."""
        if self.q_norm is None or self.k_norm is None:
            return self.rotary_emb(positions, q, k)
        ops = qk_norm_rotary_ops(q, self.q_norm, self.k_norm, self.kernels)
        if ops is not None:
            ops.qk_norm_rotary_inplace(q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.variance_epsilon,
                                       self.rotary_emb.cos_sin_cache, positions, self.head_dim,
                                       pdl=pdl_for(q, self.kernels))
            return q, k
        return self.rotary_emb(positions, self._head_norm(self.q_norm, q), self._head_norm(self.k_norm, k))

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self._norm_and_rotate(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, kernels: KernelChoice,
                 quant_config: QuantConfig | None = None, prefix: str = "mlp") -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, kernels=kernels,
            quant_method=quant_method(quant_config, MergedColumnParallelLinear, f"{prefix}.gate_up_proj"))
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, kernels=kernels,
            quant_method=quant_method(quant_config, RowParallelLinear, f"{prefix}.down_proj"))
        self.act_fn = SiluAndMul(kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, attention: DecoderAttention, kernels: KernelChoice,
                 quant_config: QuantConfig | None = None, prefix: str = "") -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, kernels)
        self.self_attn = attention
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, kernels)
        self.mlp = GatedMLP(arch.hidden_size, arch.intermediate_size, kernels, quant_config, f"{prefix}.mlp")

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:  # first layer: the residual stream starts as the embeddings
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):
    def __init__(self, arch: ModelArch, layers: list[DecoderLayer], kernels: KernelChoice) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, kernels)
        self.aux_layers: tuple[int, ...] = ()  # CausalLM.record_aux_hidden_states
        self.aux_sink: Callable[[torch.Tensor], None] | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.forward_layers(input_ids, positions, len(self.layers))

    def forward_layers(self, input_ids: torch.Tensor, positions: torch.Tensor, num_layers: int) -> torch.Tensor:
        """embed -> the first `num_layers` layers -> norm (early exit: lamina/spec/early_exit.py)."""
        hidden, residual = self.embed_tokens(input_ids), None
        aux = self._aux_buffer(hidden) if num_layers == len(self.layers) else None
        for i, layer in enumerate(itertools.islice(self.layers, num_layers)):
            if aux is not None and i in self.aux_layers:  # the residual stream entering layer i, written in place
                self._write_aux(aux, self.aux_layers.index(i), hidden, residual)  # (fused norms overwrite it)
            hidden, residual = layer(positions, hidden, residual)
        if aux is not None:
            self.aux_sink(aux)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def _aux_buffer(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[T, len(aux_layers) * H] for the sink's features, or None without a sink."""
        if self.aux_sink is None:
            return None
        return hidden.new_empty(hidden.shape[0], len(self.aux_layers) * hidden.shape[-1])

    @staticmethod
    def _write_aux(aux: torch.Tensor, j: int, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        """aux's j-th H columns := hidden + residual (hidden alone before the first layer): one kernel, no concat."""
        h = hidden.shape[-1]
        out = aux[:, j * h:(j + 1) * h]
        if residual is None:
            out.copy_(hidden)
        else:
            torch.add(hidden, residual, out=out)


class CausalLM(nn.Module):
    """A decoder-only LM over a flat batch; attention metadata comes from `set_attention_metadata`.

    `kernels` is the model's KernelChoice: every layer gets the same one, and lamina.layers.dispatch
    reads it (with the tensors' device and dtype) to pick a Triton kernel or the PyTorch path.
    `quant_config` (lamina.quant.config, from config.json's quantization_config) picks each linear layer's
    quantization method by its checkpoint name.
    """

    qkv_bias: ClassVar[bool | None] = None  # None: the config's attention_bias
    o_proj_bias: ClassVar[bool | None] = None  # None: the config's attention_bias
    qk_norm: ClassVar[bool] = False  # Qwen3: RMSNorm over each q / k head before RoPE
    # (fused param fragment, checkpoint fragment, shard id)
    stacked_params_mapping: ClassVar[list[tuple[str, str, str | int]]] = [
        (".qkv_proj.", ".q_proj.", "q"), (".qkv_proj.", ".k_proj.", "k"), (".qkv_proj.", ".v_proj.", "v"),
        (".gate_up_proj.", ".gate_proj.", 0), (".gate_up_proj.", ".up_proj.", 1),
    ]
    # Checkpoint tensors that are derived, not learned (some older exports include them).
    ignored_weight_suffixes: ClassVar[tuple[str, ...]] = ("rotary_emb.inv_freq",)

    def __init__(self, arch: ModelArch, attn_backend: AttentionBackend | None = None,
                 kernels: KernelChoice = DEFAULT_KERNELS, quant_config: QuantConfig | None = None) -> None:
        super().__init__()
        self.arch = arch
        self.kernels = kernels
        qkv_bias = arch.attention_bias if self.qkv_bias is None else self.qkv_bias
        o_bias = arch.attention_bias if self.o_proj_bias is None else self.o_proj_bias
        rotary = RotaryEmbedding(arch.head_dim, arch.rope_theta, arch.max_position_embeddings, arch.rope_scaling,
                                 kernels)
        # Layer by layer, each layer's weights allocated together: building all attention blocks first made
        # W2 decode of Qwen3-0.6B 4 % slower on the H200 with the same kernels (docs/BENCHMARKS.md, issue #11).
        layers = [DecoderLayer(arch, DecoderAttention(arch, qkv_bias, o_bias, self.qk_norm, attn_backend, rotary,
                                                      kernels, quant_config, f"model.layers.{i}.self_attn"),
                               kernels, quant_config, f"model.layers.{i}") for i in range(arch.num_hidden_layers)]
        self.model = DecoderModel(arch, layers, kernels)
        tied = self.model.embed_tokens if arch.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(arch.vocab_size, arch.hidden_size, tied_to=tied, kernels=kernels,
                                      quant_method=None if tied else quant_method(quant_config, ParallelLMHead,
                                                                                  "lm_head"))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] (a flat batch) -> hidden states [T, hidden_size]."""
        return self.model(input_ids, positions)

    def forward_layers(self, input_ids: torch.Tensor, positions: torch.Tensor, num_layers: int) -> torch.Tensor:
        """Like `forward`, through only the first `num_layers` decoder layers (then the final norm)."""
        return self.model.forward_layers(input_ids, positions, num_layers)

    def record_aux_hidden_states(self, layers: tuple[int, ...], sink: Callable[[torch.Tensor], None]) -> None:
        """From now on every full forward hands `sink`, within the forward (so inside a captured CUDA graph too),
        the residual stream entering each of these layers, [T, len(layers) * hidden_size] (EAGLE-3's features:
        lamina/spec/eagle.py); () stops."""
        bad = [i for i in layers if not 0 <= i < self.arch.num_hidden_layers]
        if bad:
            raise ValueError(f"aux_hidden_state_layers: {bad} are not layers of this model (0 .. "
                             f"{self.arch.num_hidden_layers - 1})")
        self.model.aux_layers = tuple(layers)
        self.model.aux_sink = sink if layers else None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> float32 logits [N, vocab_size]."""
        return self.lm_head.compute_logits(hidden)

    def _is_ignored(self, name: str) -> bool:
        # A tied checkpoint may still carry lm_head.weight (a copy of the embedding): HF ignores it too.
        tied_head = self.arch.tie_word_embeddings and name == "lm_head.weight"
        return tied_head or name.endswith(self.ignored_weight_suffixes)

    def _load_kv_scale(self, name: str, tensor: torch.Tensor) -> None:
        """self_attn.k_scale / v_scale: an fp8 KV cache's scales, optional (Attention.load_kv_scale)."""
        module, _, which = name.rpartition(".")
        try:
            self.get_submodule(f"{module}.attn").load_kv_scale(which, tensor)
        except (AttributeError, ValueError) as exc:
            raise ValueError(f"checkpoint tensor {name!r}: {exc}") from None

    def _target(self, name: str) -> tuple[str, str | int | None]:
        """Checkpoint name -> (parameter name, shard id or None)."""
        for fused, part, shard_id in self.stacked_params_mapping:
            if part in name:
                return name.replace(part, fused), shard_id
        return name, None

    def expected_weight_names(self) -> set[str]:
        """Every checkpoint name this model needs (fused parameters expanded to their parts)."""
        names: set[str] = set()
        for param_name, _ in self.named_parameters():
            parts = [param_name.replace(fused, part) for fused, part, _ in self.stacked_params_mapping
                     if fused in param_name]
            names.update(parts or [param_name])
        return names

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into the parameters; returns the checkpoint names loaded.

        Raises ValueError naming the checkpoint tensors that match no parameter (after loading the
        others) or whose shape does not match.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        unexpected: list[str] = []
        for name, tensor in weights:
            if self._is_ignored(name):
                continue
            if name.endswith(KV_SCALE_NAMES):
                self._load_kv_scale(name, tensor)
                loaded.add(name)
                continue
            param_name, shard_id = self._target(name)
            param = params.get(param_name)
            if param is None:
                unexpected.append(name)
                continue
            try:
                _load_one(param, tensor, shard_id)
            except ValueError as exc:
                raise ValueError(f"checkpoint tensor {name!r}: {exc}") from None
            loaded.add(name)
        if unexpected:
            raise ValueError(f"checkpoint has {len(unexpected)} tensor(s) this {type(self).__name__} does not "
                             f"expect: {format_names(unexpected)}")
        return loaded


def _load_one(param: nn.Parameter, tensor: torch.Tensor, shard_id: str | int | None) -> None:
    loader = getattr(param, "weight_loader", None)
    if loader is None:  # plain parameters (norm weights): same shape, straight copy
        copy_checked(param, tensor, "parameter")
    elif shard_id is None:
        loader(param, tensor)
    else:
        loader(param, tensor, shard_id)

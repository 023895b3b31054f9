"""What AutoGPTQ / GPTQModel (gptq_format.py) and AutoAWQ (awq_format.py) checkpoints share: integer weights
packed in int32 words with per-group scales and zero points, [in, out]-major, read under the checkpoint's own
tensor names and converted once loaded into the layout of wna16.py, so the same reference path and the same
Triton kernels run them:

    checkpoint (per linear X)                         after process_after_loading (wna16.py's parameters)
    X.qweight  int32  (GPTQ [in/pw, out], AWQ [in, out/8])   weight_packed      int32 [out, in/pw]
    X.qzeros   int32  [groups, out/pw]                       weight_zero_point  int8  [out, groups]
    X.scales   fp16   [groups, out]                          weight_scale       dtype [out, groups]
    X.g_idx    int32  [in]  (GPTQ only)                      input_perm         int64 [in] (act-order only)

pw = 32 / bits values a word. A fused lamina layer (qkv_proj, gate_up_proj) holds its shards side by side along
the output columns of each checkpoint tensor; the loaders place each shard there (a column offset divided by pw
where the output dimension is packed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lamina.layers.linear import copy_checked, set_weight_attrs
from lamina.quant.config import QuantConfig, _is_linear
from lamina.quant.packing import pack_int32
from lamina.quant.wna16 import WNA16LinearMethod


@dataclass(frozen=True)
class CheckpointTensor:
    """One checkpoint tensor of a quantized linear: its shape for `cols` output columns, and the divisor of
    the column offset (pw when the output dimension is packed); per_shard: one row per fused shard (g_idx)."""

    dtype: torch.dtype
    rows: str  # "in", "in/pw" or "groups"
    col_pack: int = 1
    per_shard: bool = False


class RepackedWNA16Method(WNA16LinearMethod):
    """A WNA16 layer read from a checkpoint of another packing (subclasses: TENSORS and `unpacked`)."""

    TENSORS: dict[str, CheckpointTensor] = {}

    def create_weights(self, layer: Any, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        if getattr(layer, "tp_size", 1) > 1:
            raise NotImplementedError("tensor_parallel_size > 1 with a quantized checkpoint is not supported yet")
        self.input_size, self.output_sizes = input_size, list(output_sizes)
        groups = self.args.num_groups(input_size, type(layer).__name__)
        per_word = 32 // self.args.num_bits
        rows = {"in": input_size, "in/pw": -(-input_size // per_word), "groups": groups}
        for name, spec in self.TENSORS.items():
            dtype = params_dtype if spec.dtype.is_floating_point else spec.dtype
            shape = (len(output_sizes), input_size) if spec.per_shard else (rows[spec.rows],
                                                                             sum(output_sizes) // spec.col_pack)
            param = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            set_weight_attrs(param, {"weight_loader": self._loader(name, spec)})
            layer.register_parameter(name, param)

    def _loader(self, name: str, spec: CheckpointTensor) -> Any:
        def load(param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
            index = self._shard(shard_id)
            if spec.per_shard:
                copy_checked(param[index], loaded, name)
                return
            offset, size = sum(self.output_sizes[:index]), self.output_sizes[index]
            if offset % spec.col_pack or size % spec.col_pack:
                raise ValueError(f"{name}: output size {size} at column {offset} does not fall on whole int32 words "
                                 f"of {spec.col_pack} values")
            copy_checked(param.narrow(1, offset // spec.col_pack, size // spec.col_pack), loaded, name)
        return load

    def unpacked(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(q int8 [in, out] signed, zero point int8 [groups, out] signed, scale [groups, out], input
        permutation or None): w[i, o] = (q[i, o] - zero[g(i), o]) * scale[g(i), o]."""
        raise NotImplementedError

    def process_after_loading(self, layer: Any) -> None:
        q, zero, scale, perm = self.unpacked(layer)
        for name in self.TENSORS:
            delattr(layer, name)
        shapes = torch.tensor([[size, self.input_size] for size in self.output_sizes], dtype=torch.int64)
        for name, data in (("weight_packed", pack_int32(q.t().contiguous(), self.args.num_bits, dim=1)),
                           ("weight_scale", scale.t().contiguous()), ("weight_zero_point", zero.t().contiguous()),
                           ("weight_shape", shapes)):
            layer.register_parameter(name, nn.Parameter(data.to(scale.device), requires_grad=False))
        layer.register_buffer("input_perm", None if perm is None else perm.to(scale.device), persistent=False)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if layer.input_perm is not None:  # act-order: the columns were sorted by group, so is x
            x = x.index_select(-1, layer.input_perm)
        return super().apply(layer, x, bias)


@dataclass(frozen=True)
class PackedQuantConfig(QuantConfig):
    """A config whose every linear layer is quantized alike, except `ignore` (module name fragments) and the
    LM head unless `quantize_lm_head`."""

    quantize_lm_head: bool = False

    def make_method(self) -> RepackedWNA16Method:
        raise NotImplementedError

    def get_quant_method(self, layer: type, prefix: str) -> RepackedWNA16Method | None:
        from lamina.layers.embedding import ParallelLMHead

        if not _is_linear(layer) or (issubclass(layer, ParallelLMHead) and not self.quantize_lm_head):
            return None
        if any(part and part in prefix for part in self.ignore):
            return None
        return self.make_method()


def field_of(raw: dict[str, Any], names: tuple[str, ...], default: Any, kind: type | tuple[type, ...],
             allowed: str) -> Any:
    """quantization_config's value under the first of `names` present (or `default`), of type `kind`."""
    name = next((n for n in names if n in raw), names[0])
    value = raw.get(name, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"quantization_config.{name}: must be {allowed}, got {value!r}")
    return value

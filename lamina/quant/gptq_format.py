"""AutoGPTQ / GPTQModel checkpoints (`quant_method` "gptq"): read, and converted to wna16.py's layout.

    quantization_config: {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": true,
                          "checkpoint_format": "gptq" (default) | "gptq_v2", "lm_head": false}

    X.qweight  int32 [in / pw, out]     pw = 32 / bits values a word along the INPUT dim, the first in the
                                         lowest bits, stored unsigned (q in [0, 2^bits))
    X.qzeros   int32 [groups, out / pw]  zero points, packed along the output dim; the classic format ("gptq")
                                         stores zero - 1 (AutoGPTQ's historical off-by-one), "gptq_v2" the zero
    X.scales   fp16  [groups, out]
    X.g_idx    int32 [in]                the group of each input column: i // group_size, or with desc_act
                                         (act-order) any assignment of group_size columns per group

    w[i, o] = (q[i, o] - zero[g_idx[i], o]) * scales[g_idx[i], o]

With an act-order g_idx the columns are sorted by group (stable) when loaded, and the layer permutes its input
the same way (`input_perm`), so each group's columns are contiguous as wna16.py's groups are. Bits 4 and 8;
group_size -1 means one group per row. GPTQModel's per-module `dynamic` overrides are refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lamina.quant.config import WeightQuantArgs
from lamina.quant.packed_formats import CheckpointTensor, PackedQuantConfig, RepackedWNA16Method, field_of
from lamina.quant.packing import check_num_bits, unpack_int32

QUANT_METHOD = "gptq"
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


class GPTQLinearMethod(RepackedWNA16Method):
    def __init__(self, args: WeightQuantArgs, zeros_minus_one: bool) -> None:
        super().__init__(args)
        self.zeros_minus_one = zeros_minus_one
        pw = 32 // args.num_bits
        self.TENSORS = {"qweight": CheckpointTensor(torch.int32, "in/pw"),
                        "qzeros": CheckpointTensor(torch.int32, "groups", col_pack=pw),
                        "scales": CheckpointTensor(torch.float16, "groups"),
                        "g_idx": CheckpointTensor(torch.int32, "in", per_shard=True)}

    def unpacked(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        bits, rows = self.args.num_bits, sum(self.output_sizes)
        q = unpack_int32(layer.qweight.data, bits, self.input_size, dim=0)  # [in, out], q_stored - 2^(bits-1)
        zero = unpack_int32(layer.qzeros.data, bits, rows, dim=1)
        if self.zeros_minus_one:  # stored zero - 1, modulo 2^bits (a zero of 0 was stored as 2^bits - 1)
            half = 1 << (bits - 1)
            zero = ((zero.to(torch.int16) + half + 1) % (1 << bits) - half).to(torch.int8)
        perm = self._permutation(layer.g_idx.data, zero.shape[0])
        if perm is not None:
            q = q.index_select(0, perm)
        return q, zero, layer.scales.data, perm

    def _permutation(self, g_idx: torch.Tensor, groups: int) -> torch.Tensor | None:
        """None when g_idx is the plain i // group_size; else the stable sort of the columns by group."""
        if not bool((g_idx == g_idx[0]).all()):
            raise ValueError("g_idx: the fused shards (q/k/v or gate/up) have different act-order column groups; "
                             "lamina fuses them into one layer, so they must share one")
        g_idx = g_idx[0].to(torch.int64)
        size = self.input_size // groups
        if bool((g_idx == torch.arange(self.input_size, device=g_idx.device) // size).all()):
            return None
        if g_idx.min() < 0 or g_idx.max() >= groups or bool((torch.bincount(g_idx, minlength=groups) != size).any()):
            raise ValueError(f"g_idx: every group must hold {size} input columns (group_size), with indices in "
                             f"[0, {groups})")
        return torch.sort(g_idx, stable=True).indices


@dataclass(frozen=True)
class GPTQConfig(PackedQuantConfig):
    bits: int = 4
    group_size: int = 128
    desc_act: bool = False
    sym: bool = True
    checkpoint_format: str = "gptq"

    def make_method(self) -> GPTQLinearMethod:
        group = self.group_size != -1
        args = WeightQuantArgs(num_bits=self.bits, symmetric=False, strategy="group" if group else "channel",
                               group_size=self.group_size if group else None)
        return GPTQLinearMethod(args, zeros_minus_one=self.checkpoint_format == "gptq")


def parse_config(raw: dict[str, Any]) -> GPTQConfig:
    """config.json's quantization_config for quant_method "gptq"; ValueError naming a field lamina does not run."""
    bits = field_of(raw, ("bits",), 4, int, "an integer")
    check_num_bits(bits, "quantization_config.bits")
    group_size = field_of(raw, ("group_size",), 128, int, "a positive integer or -1")
    if group_size != -1 and group_size <= 0:
        raise ValueError(f"quantization_config.group_size: must be a positive integer or -1, got {group_size}")
    fmt = field_of(raw, ("checkpoint_format",), "gptq", str, f"one of {list(CHECKPOINT_FORMATS)}")
    if fmt not in CHECKPOINT_FORMATS:
        raise ValueError(f"quantization_config.checkpoint_format: {fmt!r} is not supported; supported: "
                         f"{list(CHECKPOINT_FORMATS)}")
    if raw.get("dynamic"):
        raise ValueError("quantization_config.dynamic: per-module overrides are not supported; send null or {}")
    return GPTQConfig(quant_method=QUANT_METHOD, schemes=(), bits=bits, group_size=group_size,
                      desc_act=field_of(raw, ("desc_act",), False, bool, "true or false"),
                      sym=field_of(raw, ("sym",), True, bool, "true or false"), checkpoint_format=fmt,
                      quantize_lm_head=field_of(raw, ("lm_head",), False, bool, "true or false"))

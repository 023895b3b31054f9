"""AutoAWQ GEMM checkpoints (`quant_method` "awq", `version` "gemm"): read, and converted to wna16.py's layout.

    quantization_config: {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true,
                          "version": "gemm", "modules_to_not_convert": null}   (w_bit / q_group_size too)

    X.qweight  int32 [in, out / 8]       8 values a word along the OUTPUT dim, interleaved: bits 4j..4j+3 of
                                          word c hold column 8c + ORDER[j], ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
                                          (AutoAWQ's AWQ_ORDER), stored unsigned
    X.qzeros   int32 [groups, out / 8]   the zero points, packed the same way
    X.scales   fp16  [groups, out]

    w[i, o] = (q[i, o] - zero[i // group_size, o]) * scales[i // group_size, o]

Only 4-bit GEMM checkpoints with zero points (what AutoAWQ writes by default); "gemv", "marlin", "exllama"
layouts and `zero_point` false are refused, naming the field. `modules_to_not_convert` stays unquantized.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lamina.quant.config import WeightQuantArgs
from lamina.quant.packed_formats import CheckpointTensor, PackedQuantConfig, RepackedWNA16Method, field_of
from lamina.quant.packing import unpack_int32

QUANT_METHOD = "awq"
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j of a word holds column AWQ_ORDER[j]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column k is nibble AWQ_REVERSE_ORDER[k]


def unpack_awq(packed: torch.Tensor, columns: int) -> torch.Tensor:
    """int32 [rows, columns / 8] in AWQ's interleaved order -> signed int8 [rows, columns] (q - 8)."""
    nibbles = unpack_int32(packed, 4, columns, dim=1)  # column 8c + j holds nibble j of word c
    return nibbles.view(packed.shape[0], columns // 8, 8)[..., list(AWQ_REVERSE_ORDER)].reshape(-1, columns)


class AWQLinearMethod(RepackedWNA16Method):
    TENSORS = {"qweight": CheckpointTensor(torch.int32, "in", col_pack=8),
               "qzeros": CheckpointTensor(torch.int32, "groups", col_pack=8),
               "scales": CheckpointTensor(torch.float16, "groups")}

    def unpacked(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        rows = sum(self.output_sizes)
        return unpack_awq(layer.qweight.data, rows), unpack_awq(layer.qzeros.data, rows), layer.scales.data, None


@dataclass(frozen=True)
class AWQConfig(PackedQuantConfig):
    group_size: int = 128

    def make_method(self) -> AWQLinearMethod:
        group = self.group_size != -1
        return AWQLinearMethod(WeightQuantArgs(num_bits=4, symmetric=False, strategy="group" if group else "channel",
                                               group_size=self.group_size if group else None))


def parse_config(raw: dict[str, Any]) -> AWQConfig:
    """config.json's quantization_config for quant_method "awq"; ValueError naming a field lamina does not run."""
    bits = field_of(raw, ("bits", "w_bit"), 4, int, "4")
    if bits != 4:
        raise ValueError(f"quantization_config.bits: AWQ checkpoints of 4 bits are supported, got {bits}")
    group_size = field_of(raw, ("group_size", "q_group_size"), 128, int, "a positive integer or -1")
    if group_size != -1 and group_size <= 0:
        raise ValueError(f"quantization_config.group_size: must be a positive integer or -1, got {group_size}")
    version = field_of(raw, ("version",), "gemm", str, "'gemm'")
    if version.lower() != "gemm":
        raise ValueError(f"quantization_config.version: {version!r} is not supported; supported: ['gemm']")
    if not field_of(raw, ("zero_point",), True, bool, "true or false"):
        raise ValueError("quantization_config.zero_point: false is not supported (AutoAWQ GEMM writes zero points)")
    ignore = raw.get("modules_to_not_convert") or []
    if not isinstance(ignore, list) or not all(isinstance(m, str) for m in ignore):
        raise ValueError(f"quantization_config.modules_to_not_convert: must be a list of module names, got {ignore!r}")
    return AWQConfig(quant_method=QUANT_METHOD, schemes=(), ignore=tuple(ignore), group_size=group_size)

"""LLM.int8() (Dettmers et al., 2022): int8 matmul with a mixed-precision decomposition of outlier features.

    x [M, K]: outlier columns O = {j : max_m |x_mj| > threshold (6.0)}, found per call
    y = int8(x with O zeroed; per-token scales) @ int8(W; per-row scales)^T    vector-wise int8, int32 sums
      + x[:, O] @ (W[:, O] dequantized)^T                                       in the model dtype (16-bit)

as bitsandbytes' Linear8bitLt computes it for inference (the outlier columns of W are its int8 columns
dequantized, so the checkpoint holds int8 weights only).

Storage: the weights are exactly `int8`'s (compressed-tensors pack-quantized, num_bits 8, one symmetric scale
per output channel, no input_activations: W8A16), plus lamina's marker
`"lamina_llm_int8": {"threshold": 6.0}` at the top of `quantization_config`. compressed-tensors' config model
ignores unknown top-level keys, so transformers and vLLM load the checkpoint as the W8A16 it is, which is at
least as accurate as LLM.int8() (it does not quantize activations); writing it as int-quantized W8A8 instead
would have had them serve plain per-token W8A8, without the outlier path that is LLM.int8()'s point.
"""
from __future__ import annotations

from typing import Any

import torch

from lamina.quant.int8 import weight_args
from lamina.quant.recipe import Recipe
from lamina.quant.rtn import rtn_quantize
from lamina.quant.w8a8 import flat, int8_matmul, per_token_int8
from lamina.quant.wna16 import WNA16LinearMethod

DEFAULT_THRESHOLD = 6.0


class LLMInt8LinearMethod(WNA16LinearMethod):
    """WNA16's int8 parameters (pack-quantized or naive), computed as LLM.int8() (module docstring)."""

    def __init__(self, args: Any, threshold: float = DEFAULT_THRESHOLD) -> None:
        super().__init__(args)
        self.threshold = threshold

    def process_after_loading(self, layer: Any) -> None:
        """Unpack the int8 weights once (a buffer beside the checkpoint's words, not saved)."""
        layer.register_buffer("weight_int8", self.integer_weight(layer).contiguous(), persistent=False)

    def _int8(self, layer: Any) -> torch.Tensor:
        q = getattr(layer, "weight_int8", None)
        return self.integer_weight(layer) if q is None else q

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2, q, w_scale = flat(x), self._int8(layer), layer.weight_scale
        outliers = (x2.abs() > self.threshold).any(dim=0)
        x_q, x_scale = per_token_int8(x2.masked_fill(outliers, 0))
        out = (int8_matmul(x_q, q).float() * x_scale * w_scale.float().t()).to(x.dtype)
        if x2.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # a CUDA graph cannot size a gather by the data: all columns, the inliers zeroed
            out = out + x2 * outliers @ (q.to(x.dtype) * w_scale.to(x.dtype)).t()
        elif bool(outliers.any()):
            cols = outliers.nonzero().squeeze(1)
            out = out + x2[:, cols] @ (q[:, cols].to(x.dtype) * w_scale.to(x.dtype)).t()
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], out.shape[-1])


RECIPE = Recipe(name="llm_int8", summary="LLM.int8(): int8 weights per channel, int8 activations per token, "
                                         f"input columns over {DEFAULT_THRESHOLD} in 16-bit",
                weight_args=weight_args, quantize=rtn_quantize, max_ppl_increase=0.01, max_kl=0.01,
                llm_int8_threshold=DEFAULT_THRESHOLD)

"""Quantization (issue #13): the seam (config.py: QuantConfig.get_quant_method), the runtime methods
(wna16.py), the checkpoint format (compressed_tensors.py, packing.py), the offline methods (int8.py, rtn4.py)
and `lamina quantize` / `lamina eval` (quantize.py, evaluate.py, cli.py). docs/quantization.md is the guide."""

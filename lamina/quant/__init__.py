"""Quantization at run time (issue #13): the seam (config.py: QuantConfig.get_quant_method), the runtime methods
(wna16.py), the checkpoint format (compressed_tensors.py, packing.py) and the offline algorithms that work on
tensors alone (rtn.py; the int8.py and rtn4.py recipes). `lamina quantize` / `lamina eval`, which load models,
are lamina.quantize. docs/quantization.md is the guide."""

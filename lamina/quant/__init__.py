"""Quantization at run time (issue #13): the seam (config.py: QuantConfig.get_quant_method), the runtime methods
(wna16.py weight-only; llm_int8.py LLM.int8(); w8a8.py, w8a8_int8.py and fp8.py W8A8), the checkpoint format
(compressed_tensors.py, packing.py; AutoGPTQ / GPTQModel and AutoAWQ checkpoints read by gptq_format.py and
awq_format.py over packed_formats.py) and the offline algorithms that work on tensors alone (rtn.py; the int8.py,
rtn4.py, llm_int8.py, w8a8_int8.py and fp8.py recipes). `lamina quantize` / `lamina eval`, which load models,
are lamina.quantize. docs/quantization.md is the guide."""

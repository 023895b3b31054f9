"""`lamina quantize` and `lamina eval`: the offline tool around lamina.quant (issue #13).

It quantizes a checkpoint with a lamina.quant recipe (writer.py) or a calibrated method (methods.py: GPTQ in
gptq.py, AWQ in awq.py / awq_layer.py, run layer by layer by calibrate.py / layerwise.py on calibration.py's
data), evaluates it against the unquantized model with lamina's own forward (evaluate.py) and gates the
write on the result (gate.py, cli.py). It sits above the loader and the models, which use lamina.quant at
run time: keeping it out of lamina.quant keeps the package's imports one-way (tests/test_imports.py).
"""

"""INT8 and FP16 for every task: the quantize ladder every task climbs (:mod:`pipeline.quantize.ladder`), the
quantizers (ONNX Runtime, ModelOpt), mixed precision, FP16 conversion and the quantize stage's report helpers."""

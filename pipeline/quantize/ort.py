"""ONNX Runtime's static INT8 quantizer with the options TensorRT accepts: the quantize stage's ``ort``
quantizer, and what the latency table quantizes its timing networks with (a module of its own, so that
the prune stage's code hash does not depend on the whole quantize stage)."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from device.errors import require
from pipeline.export.onnx import INPUT_NAME


@contextlib.contextmanager
def quiet(*loggers: str):
    """Silences a quantizer's per-call chatter (histogram sizes, hints, progress bars) on stdout,
    stderr and the log."""
    saved = {name: logging.getLogger(name).level for name in ("", *loggers)}
    for name in saved:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def quantize_ort(fp32: Path, out: Path, calibration: np.ndarray, method: str, per_channel: bool,
                 nodes_to_exclude: Sequence[str] = ()) -> None:
    """ONNX Runtime ``quantize_static`` with the options TensorRT accepts.

    Symmetric int8 activations and weights (zero points 0), Q/DQ format, and no bias
    quantization: ORT's default int32 biases in DequantizeLinear are rejected by TensorRT's parser.

    Args:
        nodes_to_exclude: Node names left in float (a detector's box-regression branch).
    """
    ortq = require("onnxruntime.quantization", "ONNX Runtime", "pip install 'edgefold[device]'")
    CalibrationDataReader, CalibrationMethod = ortq.CalibrationDataReader, ortq.CalibrationMethod
    QuantFormat, QuantType, quantize_static = ortq.QuantFormat, ortq.QuantType, ortq.quantize_static

    # Batches of one size: ORT's histogram calibrators (entropy, percentile) stack each tensor's batches into one
    # array and fail on a short last batch ("inhomogeneous shape"), as 48 held-in images in batches of 32 gave.
    size = max(d for d in range(1, min(32, len(calibration)) + 1) if len(calibration) % d == 0)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calibration[i : i + size] for i in range(0, len(calibration), size))

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {INPUT_NAME: batch}

    methods = {"max": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    with quiet():
        quantize_static(
            str(fp32), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, calibrate_method=methods[method],
            # Conv and the residual Add: the placement TensorRT recommends; the classifier stays float.
            op_types_to_quantize=["Conv", "Add"], nodes_to_exclude=list(nodes_to_exclude) or None,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False},
        )

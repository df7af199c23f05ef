"""Scores of an ONNX model under ONNX Runtime on the host (which runs Q/DQ and FP16 models on CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from device.runners.onnxruntime import OnnxRuntimeRunner


def onnx_accuracy(path: Path, images: np.ndarray, labels: np.ndarray, batch: int = 250,
                  save_predictions: Path | None = None) -> dict:
    """Scores with the counts behind them (:func:`pipeline.tasks.classification.scores.accuracy`); each image's top-1
    class kept when asked. An FP16 model's figure here is ONNX Runtime's CPU emulation (casts around most
    nodes), not the device's."""
    from pipeline.tasks.classification.scores import accuracy, save_top1

    with OnnxRuntimeRunner(path) as runner:
        logits = np.concatenate([runner.infer(images[i : i + batch]) for i in range(0, len(images), batch)])
    if save_predictions is not None:
        save_top1(save_predictions, logits)
    return accuracy(logits, labels)

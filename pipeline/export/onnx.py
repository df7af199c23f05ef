"""The ONNX export every rung goes through, and its parity check against torch (export stage, quantize stage,
the latency table's sub-networks)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from device.runners.onnxruntime import OnnxRuntimeRunner

INPUT_NAME, OUTPUT_NAME = "input", "logits"


def export_onnx(model: torch.nn.Module, path: Path, input_shape: tuple[int, ...], opset: int) -> dict:
    """Exports ``model`` (eval mode) with a dynamic batch axis; returns facts about the graph."""
    import onnx

    model = model.eval().cpu()
    # The TorchScript exporter folds BatchNorm into the preceding Conv in eval mode; the
    # dynamo exporter keeps them, and TensorRT would have to fuse them itself.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter is chosen on purpose
        torch.onnx.export(
            model, (torch.zeros(input_shape),), str(path), dynamo=False, opset_version=opset,
            input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}}, do_constant_folding=True,
        )
    graph = onnx.load(str(path))
    onnx.checker.check_model(graph, full_check=True)
    ops = [node.op_type for node in graph.graph.node]
    return {"nodes": len(ops), "batchnorm_nodes": ops.count("BatchNormalization"),
            "conv_nodes": ops.count("Conv"), "opset": opset, "size_mb": path.stat().st_size / 1e6}


def check_parity(model: torch.nn.Module, onnx_path: Path, images: np.ndarray) -> dict:
    """Compares torch and ONNX Runtime logits on the same preprocessed images."""
    with torch.no_grad():
        reference = model.eval()(torch.from_numpy(images)).numpy()
    with OnnxRuntimeRunner(onnx_path) as runner:
        got = np.concatenate([runner.infer(images[i : i + 64]) for i in range(0, len(images), 64)])
    diff = np.abs(got - reference)
    return {"images": int(len(images)), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "top1_agreement": float((got.argmax(1) == reference.argmax(1)).mean())}

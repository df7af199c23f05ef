"""The int8-weights check every INT8 artifact passes (classification's quantize stage and detection's): a library of
its own, so the detection quantize stage runs the very same check without importing a classification stage."""

from __future__ import annotations

from pathlib import Path


def float_weights(path: Path) -> list[str]:
    """Weights that reach a DequantizeLinear in float: quantized at run time, stored at full size.

    A real INT8 artifact stores each quantized weight as an int8 initializer feeding a
    DequantizeLinear; a float initializer behind a QuantizeLinear (what a fake-quantized torch
    model exports) is four times the size and only pretends to be INT8 on disk.
    """
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    floats = {t.name for t in graph.initializer if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)}
    return [node.name or node.input[0] for node in graph.node
            if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.input[0] in floats
            and len(_initializer_dims(graph, node.input[0])) > 1]


def _initializer_dims(graph, name: str) -> list[int]:
    return next((list(t.dims) for t in graph.initializer if t.name == name), [])

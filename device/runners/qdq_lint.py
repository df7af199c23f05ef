"""A TensorRT Q/DQ lint: the rules TensorRT's ONNX parser enforces on explicitly quantized
models, checked without TensorRT (it cannot be installed on the build host).

Each finding names the node and the rule, so a failing quantization says what to change.
Only onnx and numpy: the device side may lint an upload before it builds an engine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

STANDARD_DOMAINS = ("", "ai.onnx")
MIN_OPSET = 13
WEIGHT_OPS = ("Conv", "Gemm", "MatMul", "ConvTranspose")


@dataclass(frozen=True)
class Finding:
    """One broken rule."""

    rule: str
    node: str
    message: str


@dataclass
class LintReport:
    """The lint's verdict and the summary of which layers stay in float."""

    findings: list[Finding] = field(default_factory=list)
    quantized_layers: list[str] = field(default_factory=list)
    float_layers: list[str] = field(default_factory=list)
    qdq_pairs: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "findings": [asdict(f) for f in self.findings], "qdq_pairs": self.qdq_pairs,
                "quantized_layers": len(self.quantized_layers), "float_layers": self.float_layers}

    def describe(self) -> str:
        return "; ".join(f"{f.node}: [{f.rule}] {f.message}" for f in self.findings[:5]) + (
            f" (+{len(self.findings) - 5} more)" if len(self.findings) > 5 else "")


def _constants(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _attr(node, name: str, default: Any) -> Any:
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def lint_qdq(model_or_path) -> LintReport:
    """Checks a Q/DQ ONNX model against TensorRT's explicit-quantization rules.

    Rules: ``opset`` (≥ 13), ``domain`` (standard ops only), ``scale`` (a positive float
    constant), ``zero-point`` (int8 and 0), ``dq-input`` (only int8 weights may feed a
    DequantizeLinear directly, never int32 biases or floats), ``weight-axis`` (Conv/Gemm weights
    per channel on the output-channel axis), ``checker`` (onnx.checker full check).
    """
    import onnx

    model = onnx.load(str(model_or_path)) if not isinstance(model_or_path, onnx.ModelProto) else model_or_path
    report = LintReport()
    add = lambda rule, node, message: report.findings.append(Finding(rule, node, message))  # noqa: E731
    opset = next((o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS), 0)
    if opset < MIN_OPSET:
        add("opset", "<model>", f"opset {opset} < {MIN_OPSET}: per-channel Q/DQ needs opset ≥ {MIN_OPSET}")
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as err:  # onnx raises ValidationError and shape-inference errors
        add("checker", "<model>", str(err).splitlines()[0])
    constants = _constants(model)
    producers = {out: node for node in model.graph.node for out in node.output}
    for index, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{index}"
        if node.domain not in STANDARD_DOMAINS:
            add("domain", name, f"op {node.domain}::{node.op_type} is not a standard ONNX op")
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        report.qdq_pairs += node.op_type == "DequantizeLinear"
        scale = constants.get(node.input[1]) if len(node.input) > 1 else None
        if scale is None:
            add("scale", name, f"scale {node.input[1] if len(node.input) > 1 else '?'} is not a constant")
        elif scale.dtype.kind != "f" or not np.all(scale > 0):
            add("scale", name, f"scale must be positive float, got {scale.dtype} min {scale.min() if scale.size else '-'}")
        zero_point = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        non_int8_constant = (node.op_type == "DequantizeLinear" and node.input[0] in constants
                             and constants[node.input[0]].dtype != np.int8)
        if non_int8_constant:
            pass  # reported once below as dq-input; its zero point is wrong for the same reason
        elif zero_point is None:
            add("zero-point", name, "zero point missing (defaults to uint8); TensorRT needs an int8 zero point of 0")
        elif zero_point.dtype != np.int8 or np.any(zero_point != 0):
            add("zero-point", name, f"zero point must be int8 0, got {zero_point.dtype} {np.unique(zero_point)[:3]}")
        if node.op_type == "DequantizeLinear" and node.input[0] in constants:
            data = constants[node.input[0]]
            if data.dtype != np.int8:
                add("dq-input", name, f"a {data.dtype} constant feeds DequantizeLinear; only int8 weights may "
                                      "(an int32 bias here is rejected by TensorRT's parser)")
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for position, value in enumerate(node.input):
            consumers.setdefault(value, []).append((node, position))
    for index, node in enumerate(model.graph.node):
        if node.op_type not in WEIGHT_OPS or len(node.input) < 2:
            continue
        name = node.name or f"{node.op_type}_{index}"
        weight_source = producers.get(node.input[1])
        if weight_source is None or weight_source.op_type != "DequantizeLinear":
            report.float_layers.append(name)
            continue
        report.quantized_layers.append(name)
        scale = constants.get(weight_source.input[1])
        if scale is None or scale.size <= 1:
            continue  # per-tensor weights are legal for TensorRT
        # The output-channel axis of the weight tensor: Conv (M, C/g, kH, kW) and Gemm with transB (N, K)
        # hold it first; ConvTranspose (C, M/g, kH, kW), MatMul and plain Gemm (K, N) hold it second.
        expected = 0
        if (node.op_type == "Gemm" and not _attr(node, "transB", 0) or node.op_type in ("MatMul", "ConvTranspose")):
            expected = 1
        axis = _attr(weight_source, "axis", 1)
        if axis != expected:
            add("weight-axis", weight_source.name or name,
                f"{node.op_type} weights dequantized per channel on axis {axis}; TensorRT needs axis {expected} "
                "(output channels)")
    return report

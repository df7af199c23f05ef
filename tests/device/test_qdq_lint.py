"""Each TensorRT Q/DQ rule is proven by a model that breaks exactly that rule."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from device.runners.qdq_lint import lint_qdq


def build(opset=17, x_scale=0.02, x_zero=np.int8(0), w_axis=0, per_channel=True,
          bias_int32=False, custom_op=False, scale_from_input=False, quantize_weight=True, drop_zero=False):
    """A Q/DQ Conv the way TensorRT wants it, with one knob per rule."""
    weight = np.arange(2 * 3, dtype=np.int8).reshape(2, 3, 1, 1)
    channels = 2 if w_axis == 0 else 3
    w_scale = np.full(channels if per_channel else (), 0.01, dtype=np.float32)
    inits = [
        numpy_helper.from_array(np.array(x_scale, dtype=np.float32), "x_scale"),
        numpy_helper.from_array(np.array(x_zero), "x_zero"),
        numpy_helper.from_array(w_scale, "w_scale"),
        numpy_helper.from_array(np.zeros(w_scale.shape, dtype=np.int8), "w_zero"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])]
    if scale_from_input:
        inputs.append(helper.make_tensor_value_info("dyn_scale", TensorProto.FLOAT, []))
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "dyn_scale" if scale_from_input else "x_scale",
                                            "" if drop_zero else "x_zero"], ["xq"], name="quant_x"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "" if drop_zero else "x_zero"], ["xdq"], name="dequant_x"),
    ]
    if quantize_weight:
        inits.append(numpy_helper.from_array(weight, "w_int8"))
        attrs = {"axis": w_axis} if per_channel else {}
        nodes.append(helper.make_node("DequantizeLinear", ["w_int8", "w_scale", "w_zero"], ["w"], name="dequant_w", **attrs))
    else:
        inits.append(numpy_helper.from_array(weight.astype(np.float32), "w"))
    conv_inputs = ["xdq", "w"]
    if bias_int32:
        inits += [numpy_helper.from_array(np.array([5, -5], dtype=np.int32), "b_int32"),
                  numpy_helper.from_array(np.full(2, 2e-4, dtype=np.float32), "b_scale"),
                  numpy_helper.from_array(np.zeros(2, dtype=np.int32), "b_zero")]
        nodes.append(helper.make_node("DequantizeLinear", ["b_int32", "b_scale", "b_zero"], ["b"], name="dequant_b", axis=0))
        conv_inputs.append("b")
    nodes.append(helper.make_node("Conv", conv_inputs, ["y"], name="conv"))
    output = "y"
    opsets = [helper.make_opsetid("", opset)]
    if custom_op:
        nodes.append(helper.make_node("FastGelu", ["y"], ["z"], name="gelu", domain="com.microsoft"))
        opsets.append(helper.make_opsetid("com.microsoft", 1))
        output = "z"
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT, [1, 2, 4, 4])], inits)
    return helper.make_model(graph, opset_imports=opsets)


def test_a_tensorrt_ready_model_passes(tmp_path):
    report = lint_qdq(build())
    assert report.ok, report.describe()
    assert report.quantized_layers == ["conv"] and report.float_layers == [] and report.qdq_pairs == 2
    path = tmp_path / "ok.onnx"
    onnx.save(build(), str(path))
    assert lint_qdq(path).ok


@pytest.mark.parametrize("knobs, rule", [
    (dict(opset=12, per_channel=False), "opset"),
    (dict(custom_op=True), "domain"),
    (dict(x_scale=-0.02), "scale"),
    (dict(scale_from_input=True), "scale"),
    (dict(x_zero=np.int8(3)), "zero-point"),
    (dict(x_zero=np.uint8(0)), "zero-point"),
    (dict(drop_zero=True), "zero-point"),
    (dict(bias_int32=True), "dq-input"),
    (dict(w_axis=1), "weight-axis"),
])
def test_each_rule_is_caught(knobs, rule):
    found = lint_qdq(build(**knobs)).findings
    assert {f.rule for f in found} == {rule}, found
    assert all(f.node and f.message for f in found)


def test_float_layers_are_summarised():
    report = lint_qdq(build(quantize_weight=False))
    assert report.ok and report.float_layers == ["conv"] and report.quantized_layers == []


def test_per_tensor_weights_are_legal():
    assert lint_qdq(build(per_channel=False)).ok


def _conv_transpose(w_axis: int):
    """A Q/DQ ConvTranspose 3 → 2 channels: its weight is (C_in=3, C_out=2, 1, 1)."""
    weight = np.arange(3 * 2, dtype=np.int8).reshape(3, 2, 1, 1)
    channels = weight.shape[w_axis]
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "x_zero"),
             numpy_helper.from_array(weight, "w_int8"),
             numpy_helper.from_array(np.full(channels, 0.01, np.float32), "w_scale"),
             numpy_helper.from_array(np.zeros(channels, np.int8), "w_zero")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"], name="quant_x"),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xdq"], name="dequant_x"),
             helper.make_node("DequantizeLinear", ["w_int8", "w_scale", "w_zero"], ["w"], name="dequant_w",
                              axis=w_axis),
             helper.make_node("ConvTranspose", ["xdq", "w"], ["y"], name="deconv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_conv_transpose_weights_are_per_channel_on_axis_1():
    """ConvTranspose's weight is (C_in, C_out/group, kH, kW): its output channels are axis 1, not 0."""
    assert lint_qdq(_conv_transpose(w_axis=1)).ok
    found = lint_qdq(_conv_transpose(w_axis=0)).findings
    assert [f.rule for f in found] == ["weight-axis"] and "axis 1" in found[0].message

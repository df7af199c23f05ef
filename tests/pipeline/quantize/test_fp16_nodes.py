"""A named set of ONNX nodes rewritten to FP16 with Casts at its edges, on a hand-made graph where every edge case is
planted: a weight shared with a node outside the set, a Constant inside it, a tensor read on both sides."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from device.errors import StageError
from device.runners.onnxruntime import OnnxRuntimeRunner
from pipeline.quantize.fp16_nodes import fp16_nodes, nodes_to_fp16


def _graph():
    """x → conv_a (outside) and conv_b (inside) share weight w; conv_b → mul by a Constant (inside) → relu (inside);
    the output adds conv_a's and relu's results (outside), and relu's result is also a graph output."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w"], ["b"], name="box/conv_b", pads=[1, 1, 1, 1]),
        helper.make_node("Constant", [], ["k"], name="box/k",
                         value=numpy_helper.from_array(np.array(1.5, np.float32), "k")),
        helper.make_node("Mul", ["b", "k"], ["c"], name="box/mul"),
        helper.make_node("Relu", ["c"], ["box_out"], name="box/relu"),
        helper.make_node("Add", ["a", "box_out"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 8, 8]),
         helper.make_tensor_value_info("box_out", TensorProto.FLOAT, ["n", 4, 8, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, path, x):
    onnx.save(model, str(path))
    with OnnxRuntimeRunner(path) as runner:
        return runner.session.run(None, {"x": x})


def test_only_the_named_nodes_compute_in_fp16_and_the_graph_keeps_its_float32_interface(tmp_path):
    box = ["box/conv_b", "box/k", "box/mul", "box/relu"]
    reference, model = _graph(), _graph()
    facts = nodes_to_fp16(model, box)
    assert fp16_nodes(model) == {"box/conv_b", "box/k", "box/mul", "box/relu"}
    assert facts == {"fp16_nodes": 4, "casts_in": 1, "casts_out": 1, "weights_fp16": 2}  # x in; box_out out
    weights = {init.name: init.data_type for init in model.graph.initializer}
    assert weights == {"w": TensorProto.FLOAT, "w_fp16": TensorProto.FLOAT16}, "conv_a keeps its float32 weight"
    assert [v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]] == [TensorProto.FLOAT] * 3
    x = np.random.default_rng(1).random((2, 3, 8, 8), dtype=np.float32)
    (y, box_out), (y_ref, box_ref) = _run(model, tmp_path / "h.onnx", x), _run(reference, tmp_path / "f.onnx", x)
    assert box_out.dtype == np.float32
    np.testing.assert_allclose(box_out, box_ref, rtol=5e-3, atol=5e-3)
    assert not np.array_equal(box_out, box_ref), "the box path ran in FP16: its values were rounded"
    np.testing.assert_allclose(y - box_out, y_ref - box_ref, rtol=1e-6, atol=1e-6)  # conv_a untouched


def test_a_name_that_is_not_a_node_is_refused_rather_than_shrinking_the_set():
    with pytest.raises(StageError, match="not in the graph"):
        nodes_to_fp16(_graph(), ["box/conv_b", "box/missing"])

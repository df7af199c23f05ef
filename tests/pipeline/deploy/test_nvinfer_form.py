"""The graph nvinfer runs, written beside each rung for the deploy stage to time (pipeline.deploy.nvinfer_form):
real ONNX graphs, built here."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from pipeline.deploy.nvinfer_form import write_forms


class _Ship:
    """A task's ship hooks as write_forms asks them: a per-channel std and a Softmax at the end."""

    def preprocess(self, run_dir):
        return {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.3, 0.4]}

    def softmax(self):
        return True


def _graph(path, output_type: int) -> None:
    nodes = [helper.make_node("ReduceMean", ["images"], ["pooled"], axes=[2, 3], keepdims=0)]
    if output_type == TensorProto.INT64:
        nodes.append(helper.make_node("ArgMax", ["pooled"], ["out"], axis=1, keepdims=0))
        shape = [1]
    else:
        nodes.append(helper.make_node("Identity", ["pooled"], ["out"]))
        shape = [1, 3]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("out", output_type, shape)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_a_form_is_written_where_the_graph_differs_and_a_graph_it_cannot_take_is_said_not_dropped(tmp_path):
    _graph(tmp_path / "logits.onnx", TensorProto.FLOAT)
    _graph(tmp_path / "argmax.onnx", TensorProto.INT64)
    said = []
    forms = write_forms(_Ship(), tmp_path, {"student": tmp_path / "logits.onnx", "odd": tmp_path / "argmax.onnx"},
                        tmp_path, said.append)
    assert set(forms) == {"student"} and len(forms["student"].changes) == 2  # the 1/std Mul and the Softmax
    ops = [node.op_type for node in onnx.load(str(forms["student"].path)).graph.node]
    assert ops[0] == "Mul" and ops[-1] == "Softmax"
    assert not (tmp_path / "nvinfer-odd.onnx").exists()
    assert len(said) == 1 and said[0].startswith("odd: the graph nvinfer runs could not be written") and \
        "float32" in said[0]
    assert write_forms(None, tmp_path, {"student": tmp_path / "logits.onnx"}, tmp_path) == {}

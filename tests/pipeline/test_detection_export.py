"""A detector exported to its raw head outputs, decoded on the device's path, and quantized with its box branch in
FP16, in FP32 or quantized."""

import json
import shutil

import numpy as np
import onnx
import pytest
import torch

from device.scoring.detection_post import load_head_spec, postprocess
from device.errors import ConfigError
from device.runners.qdq_lint import lint_qdq
from device.runners.onnxruntime import OnnxRuntimeRunner
from pipeline.tasks.detection.export import box_branch_nodes, export_detector, network_inputs, raw_outputs, sidecar_path
from pipeline.tasks.detection.models import build_detector
from pipeline.tasks.detection.recipe import BOX_HEADS
from pipeline.tasks.detection.train import predict
from pipeline.quantize.fp16_nodes import fp16_nodes
from pipeline.quantize.int8_weights import float_weights
from pipeline.quantize.ladder import Step, check_candidate
from pipeline.tasks.detection.int8 import quantize_detector


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny FCOS with its head's weights spread (an untrained head scores every anchor alike, and near-ties may
    swap between two float paths) and its ONNX."""
    torch.manual_seed(0)
    model = build_detector("tiny_fcos", 3).eval()
    with torch.no_grad():
        for name, parameter in model.head.named_parameters():
            if name.endswith("weight") and parameter.ndim == 4:
                parameter.normal_(0, 0.2)
    path = tmp_path_factory.mktemp("det-export") / "student.onnx"
    facts = export_detector(model, path, "tiny_fcos", 64, 0, 17)
    images = (np.random.default_rng(0).random((5, 64, 64)) * 255).astype(np.uint8)
    return model, path, facts, images


def test_the_onnx_ends_at_the_raw_head_for_any_batch(exported):
    model, path, facts, images = exported
    inputs = network_inputs(images, 64)
    spec = load_head_spec(sidecar_path(path))
    with OnnxRuntimeRunner(path) as runner:
        for batch in (1, 5):  # a dynamic batch axis
            got = runner.infer(inputs[:batch])
            assert got.shape == (batch, len(spec.anchors), spec.width) == (batch, 80, 3 + 4 + 1)
            np.testing.assert_allclose(got, raw_outputs(model, inputs[:batch]), atol=1e-4)
    assert facts["batchnorm_nodes"] == 0 and facts["box_branch_nodes"] > 0


def test_device_decoding_of_the_onnx_reproduces_the_torch_detector(exported):
    model, path, _, images = exported
    with OnnxRuntimeRunner(path) as runner:
        raw = runner.infer(network_inputs(images, 64))
    got = postprocess(load_head_spec(sidecar_path(path)), raw, [im.shape for im in images])
    expected = predict(model, images)
    for mine, theirs in zip(got, expected):
        assert len(mine["boxes"]) == len(theirs.labels) > 0
        assert np.array_equal(mine["labels"], theirs.labels)
        np.testing.assert_allclose(mine["boxes"], theirs.xyxy, atol=1e-3)


def _quantized(exported, tmp_path, box_head):
    """The quantize stage's own candidate for ``box_head`` (quantized, rewritten, linted, int8 weights checked)."""
    _, path, _, images = exported
    fp32 = tmp_path / "student.onnx"  # the quantizer writes beside its input: a copy, never the shared fixture's
    shutil.copyfile(path, fp32)
    out = tmp_path / f"box_{box_head}.onnx"
    shutil.copyfile(sidecar_path(path), sidecar_path(fp32))
    step = Step("ort", "max")
    facts = quantize_detector(step, fp32, out, network_inputs(images, 64), True, box_head, tmp_path)
    return out, {**facts, **check_candidate(out, step)}


@pytest.mark.parametrize("box_head", BOX_HEADS)
def test_each_box_head_setting_passes_the_classification_checks_and_only_fp16_has_fp16_nodes(exported, tmp_path,
                                                                                             box_head):
    path = exported[1]
    out, facts = _quantized(exported, tmp_path, box_head)
    box_nodes = set(box_branch_nodes(path))
    assert box_nodes and all("/regression_head/" in name for name in box_nodes)
    lint = lint_qdq(out)
    assert lint.ok, lint.describe()
    assert float_weights(out) == []
    box_convs = {n for n in lint.float_layers + lint.quantized_layers if "/regression_head/" in n}
    assert box_convs, "the lint sees the box branch's convolutions"
    halves = fp16_nodes(onnx.load(str(out)))
    if box_head == "int8":
        assert box_convs <= set(lint.quantized_layers) and not lint.float_layers and not halves
        return
    assert box_convs <= set(lint.float_layers) and any("/backbone/" in n for n in lint.quantized_layers)
    if box_head == "float":
        assert not halves and "box_nodes_fp16" not in facts
        return
    # fp16: every computing node of the box branch, and nothing outside it.
    computing = {n.name for n in onnx.load(str(out)).graph.node
                 if n.name in box_nodes and n.op_type in ("Conv", "InstanceNormalization", "Relu")}
    assert computing <= halves <= box_nodes and facts["box_nodes_fp16"] == len(halves)


def test_the_fp16_box_head_moves_only_the_box_columns_and_by_fp16_rounding(exported, tmp_path):
    """The class tower is untouched (its logits equal the FP32 box head's bit for bit: rewriting the whole float
    remainder to FP16 had put the class tower's GroupNorm in FP16 and cost mAP), and the box regressions and centerness differ by FP16's rounding alone."""
    path, images = exported[1], exported[3]
    spec = load_head_spec(sidecar_path(path))
    inputs = network_inputs(images, 64)
    outputs = {}
    for box_head in ("fp16", "float"):
        (tmp_path / box_head).mkdir()
        out, _ = _quantized(exported, tmp_path / box_head, box_head)
        with OnnxRuntimeRunner(out) as runner:
            outputs[box_head] = runner.infer(inputs)
    (start, end), box = spec.layout["cls_logits"], slice(spec.layout["cls_logits"][1], None)
    assert np.array_equal(outputs["fp16"][..., start:end], outputs["float"][..., start:end])
    half, full = outputs["fp16"][..., box], outputs["float"][..., box]
    assert not np.array_equal(half, full), "the box branch ran in FP16"
    np.testing.assert_allclose(half, full, rtol=1e-2, atol=1e-2 * np.abs(full).max())


def test_a_size_the_transform_would_pad_is_refused(tmp_path):
    model = build_detector("tiny_fcos", 3, 48).eval()  # FCOS pads to a multiple of 32
    with pytest.raises(ConfigError, match="multiple of 32"):
        export_detector(model, tmp_path / "m.onnx", "tiny_fcos", 48, 0, 17)


def test_recipe_thresholds_reach_the_sidecar(exported, tmp_path):
    model = exported[0]
    path = tmp_path / "m.onnx"
    export_detector(model, path, "tiny_fcos", 64, 0, 17, {"iou_threshold": 0.3, "max_detections": None})
    post = json.loads(sidecar_path(path).read_text())["postprocess"]
    assert post["iou_threshold"] == 0.3 and post["max_detections"] == model.detections_per_img

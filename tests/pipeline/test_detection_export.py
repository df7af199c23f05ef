"""A detector exported to its raw head outputs, decoded on the device's path, and quantized with its box branch float."""

import json

import numpy as np
import pytest
import torch

from device.detection_post import load_head_spec, postprocess
from device.errors import ConfigError
from device.qdq_lint import lint_qdq
from device.runners.onnxruntime import OnnxRuntimeRunner
from pipeline.detection_export import box_branch_nodes, export_detector, network_inputs, raw_outputs, sidecar_path
from pipeline.detection_models import build_detector
from pipeline.detection_train import predict
from pipeline.int8_weights import float_weights
from pipeline.ort_quantize import quantize_ort


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


@pytest.mark.parametrize("box_head", ["float", "int8"])
def test_box_branch_stays_float_unless_asked_and_passes_the_classification_checks(exported, tmp_path, box_head):
    _, path, _, images = exported
    out = tmp_path / f"box_{box_head}.onnx"
    box_nodes = box_branch_nodes(path)
    assert box_nodes and all("/regression_head/" in name for name in box_nodes)
    quantize_ort(path, out, network_inputs(images, 64), "max", True, box_nodes if box_head == "float" else ())
    lint = lint_qdq(out)
    assert lint.ok, lint.describe()
    assert float_weights(out) == []
    box_convs = {n for n in lint.float_layers + lint.quantized_layers if "/regression_head/" in n}
    assert box_convs, "the lint sees the box branch's convolutions"
    if box_head == "float":
        assert box_convs <= set(lint.float_layers)
        assert any("/backbone/" in n for n in lint.quantized_layers)
    else:
        assert box_convs <= set(lint.quantized_layers) and not lint.float_layers


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

"""The YOLO users have: graphs laid out as Ultralytics 8.4 exports a YOLOv8 (tests/pipeline/yolo_layouts.py writes
them: DFL, anchors and strides computed in the graph from the feature maps' shapes, onnxslim, Ultralytics'
metadata) get in as Ultralytics writes them: ``dynamic=True`` (batch, height and width free), ``dynamic=False``
(batch 1 fixed inside its reshapes) and ``nms=True`` (whose batch answers only its first image, refused with the
reason). The first two run through the ladder, INT8 and the report; their host mAP equals an independent decode of
the raw outputs."""

import json

import numpy as np
import onnx
import pytest
import yaml

from device.errors import ConfigError
from pipeline.tasks.detection.box_branch import traced_box_branch
from pipeline.tasks.detection.export import network_inputs
from pipeline.tasks.detection.metrics import Boxes, accumulate, match, summary
from pipeline.tasks.detection.onnx_start import write_detection_start
from tests.pipeline.yolo_layouts import (CANVAS, CLASSES, SIZE, export_ultralytics, independent_decode, trained_fcos,
                                        yolo_recipe)
from tests.slow import slow_fixture

THRESHOLD = 0.05  # the tiny detector's scores are low: Ultralytics' 0.25 would keep too few boxes to test with


@pytest.fixture(scope="module")
@slow_fixture
def exports(tmp_path_factory):
    """One trained tiny FCOS behind Ultralytics' head, exported the three ways (about 20 s), and test canvases."""
    from pipeline.tasks.detection.data import CanvasSpec, composited

    folder = tmp_path_factory.mktemp("ultralytics")
    detector = trained_fcos()
    files = {"dynamic": export_ultralytics(detector, folder / "dynamic.onnx"),
             "static": export_ultralytics(detector, folder / "static.onnx", dynamic=False),
             "nms": export_ultralytics(detector, folder / "nms.onnx", nms=True)}
    test = composited("digits", 8, 24, CanvasSpec(seed=7, **CANVAS)).test
    return folder, files, test


def _dims(path):
    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    return [d.dim_value or d.dim_param for d in dims]


def test_the_exports_are_laid_out_as_ultralytics_writes_them(exports):
    _, files, _ = exports
    assert _dims(files["dynamic"]) == ["batch", 3, "height", "width"]
    assert _dims(files["static"]) == [1, 3, SIZE, SIZE] and _dims(files["nms"])[0] == "batch"
    ops = {node.op_type for node in onnx.load(str(files["dynamic"])).graph.node}
    assert {"Shape", "Range", "Softmax"} <= ops, "anchors and strides computed in the graph, DFL's softmax"
    assert "NonMaxSuppression" in {node.op_type for node in onnx.load(str(files["nms"])).graph.node}


@pytest.mark.parametrize("kind, said", [("dynamic", "height and width fixed at 64 px"),
                                        ("static", "batch widened")])
def test_a_free_size_is_fixed_and_a_static_batch_widened_each_said(exports, kind, said, tmp_path):
    import onnxruntime as ort

    _, files, test = exports
    out = tmp_path / "ladder.onnx"
    facts, written = write_detection_start(files[kind], "yolov8", SIZE, CLASSES, out)
    assert any(said in change for change in written["changes"]), written["changes"]
    assert facts.size == SIZE and facts.rows == 80
    inputs = network_inputs(test.images[:8], SIZE)
    batched = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": inputs})[0]
    given = ort.InferenceSession(str(files[kind]), providers=["CPUExecutionProvider"])
    alone = np.concatenate([given.run(None, {"images": inputs[i:i + 1]})[0] for i in range(8)])
    assert batched.shape == (8, 4 + CLASSES, 80) and np.allclose(batched, alone, atol=1e-4)


def test_the_nms_export_that_answers_only_its_first_image_is_refused_with_the_export_to_use(exports, tmp_path):
    _, files, _ = exports
    with pytest.raises(ConfigError, match=r"answers 2 image\(s\) otherwise than alone") as caught:
        write_detection_start(files["nms"], "end2end", None, CLASSES, tmp_path / "ladder.onnx")
    assert "in the batch; 50, 50, 50 one at a time" in caught.value.message
    assert "without nms=True" in caught.value.fix and "dynamic=True" in caught.value.fix


def test_the_box_branch_holds_the_anchors_and_strides_made_from_shapes_and_goes_to_fp16(exports, tmp_path):
    """The FP16 rewrite of the box branch used to leave the strides (a ConstantOfShape's fill) in float32 where they
    meet the FP16 boxes at a Mul: an invalid graph. The branch holds them, the DFL, and no class node; the INT8
    candidate computes it in FP16 and its boxes stay within FP16's rounding of the FP32 ones."""
    import onnxruntime as ort

    from pipeline.quantize.fp16_nodes import fp16_nodes
    from pipeline.quantize.ladder import Step
    from pipeline.tasks.detection.int8 import quantize_detector

    _, files, test = exports
    out = tmp_path / "ladder.onnx"
    write_detection_start(files["dynamic"], "yolov8", SIZE, CLASSES, out, {"score_threshold": THRESHOLD})
    model = onnx.load(str(out))
    branch = set(traced_box_branch(model, columns_last=False))
    ops = {node.name: node.op_type for node in model.graph.node}
    assert {"ConstantOfShape", "Range", "Softmax", "Conv"} <= {ops[name] for name in branch}
    assert not any("classification_head" in name for name in branch)
    inputs = network_inputs(test.images, SIZE)
    facts = quantize_detector(Step("ort", "max"), out, tmp_path / "int8.onnx", inputs[:16], True, "fp16", tmp_path)
    halves = fp16_nodes(onnx.load(str(tmp_path / "int8.onnx")))
    assert facts["box_nodes_fp16"] > 0 and halves <= branch
    assert any(ops[name] == "Mul" for name in halves), "the boxes times the strides, in FP16"
    fp32 = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": inputs})[0]
    int8 = ort.InferenceSession(str(tmp_path / "int8.onnx"),
                                providers=["CPUExecutionProvider"]).run(None, {"input": inputs})[0]
    assert np.isfinite(int8).all() and np.median(np.abs(int8[:, :4] - fp32[:, :4])) < 2.0, "boxes in pixels"


def test_model_equals_an_ultralytics_export_takes_the_size_it_was_exported_at(exports):
    from pipeline.core.recipe import load_recipe

    _, files, _ = exports
    recipe, _, _ = load_recipe(str(files["dynamic"]), {"data.source": "digits-det"})
    assert recipe.start.outputs == "yolov8" and recipe.data.canvas.size == SIZE and recipe.input_size() == SIZE
    assert "the size its metadata says it was exported at" in recipe._preprocess_from


@pytest.fixture(scope="module")
@slow_fixture
def runs(exports, tmp_path_factory):
    """The dynamic and the static export through the whole ladder on a loopback agent (about 20 s each)."""
    from pipeline.runner import run_pipeline

    _, files, _ = exports
    done = {}
    for kind in ("dynamic", "static"):
        folder = tmp_path_factory.mktemp(f"run-{kind}")
        path = folder / "recipe.yaml"
        path.write_text(yaml.safe_dump(yolo_recipe(files[kind])))
        ctx = run_pipeline(str(path), runs_dir=folder / "runs", new=True)
        done[kind] = ctx.run_dir, json.loads((ctx.run_dir / "manifest.json").read_text())
    return done


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_an_ultralytics_export_runs_through_int8_to_the_report_scoring_an_independent_decode(exports, runs, kind):
    import onnxruntime as ort

    from pipeline.core.manifest import Manifest
    from pipeline.tasks.detection.files import load_split

    _, files, _ = exports
    run_dir, manifest = runs[kind]
    stages = manifest["stages"]
    assert list(stages) == ["data", "export", "quantize", "evaluate", "deploy", "report"]
    quantized = stages["quantize"]["metrics"]
    assert quantized["box_head"] == "fp16" and quantized["attempts"][-1]["box_nodes_fp16"] > 0
    deployed = json.loads((run_dir / stages["deploy"]["outputs"]["results"]).read_text())["devices"][0]["rungs"]
    assert {rung: r["state"] for rung, r in deployed.items()} == dict.fromkeys(deployed, "succeeded")
    assert {"student", "student_int8"} <= set(deployed)
    assert "student_int8" in (run_dir / stages["report"]["outputs"]["md"]).read_text()
    test = load_split(Manifest.load(run_dir).output("data", "canvases"), "test")
    session = ort.InferenceSession(str(files[kind]), providers=["CPUExecutionProvider"])
    inputs = network_inputs(test.images, SIZE)
    raw = np.concatenate([session.run(None, {"images": inputs[i:i + 1]})[0] for i in range(len(inputs))])
    found = [Boxes(boxes.astype(np.float64), labels, scores.astype(np.float64))
             for boxes, scores, labels in independent_decode(raw, "yolov8", conf=THRESHOLD)]
    theirs = summary(accumulate(match(test.boxes, found, CLASSES)))["map"]
    assert theirs > 0.02
    assert stages["export"]["metrics"]["rungs"]["student"]["scores"]["map"] == pytest.approx(theirs, abs=1e-9)
    assert stages["quantize"]["metrics"]["fp32"]["map"] == pytest.approx(theirs, abs=1e-9)


PLANTED = "/classification_head/cls_logits/Conv"  # the class logits of the stride-8 level: 64 of the 80 anchors


def test_the_mixed_step_finds_a_planted_sensitive_class_layer_on_the_yolo_layout(exports, tmp_path):
    """A class layer made sensitive to INT8 in the YOLOv8-layout graph (its float answers unchanged): every plain
    calibration loses points, the sensitivity read along the layout's columns ranks that layer first, and the
    mixed step keeps it in FP16 and ends above the best plain rung."""
    from types import SimpleNamespace

    from pipeline.quantize.ladder import climb, steps
    from pipeline.tasks.detection.data import CanvasSpec, composited
    from pipeline.tasks.detection.int8 import DetectionLadder
    from pipeline.tasks.detection.recipe import DetectionQuantizeConfig
    from tests.pipeline.yolo_layouts import planted_outlier

    _, files, _ = exports
    ladder = tmp_path / "ladder.onnx"
    write_detection_start(files["dynamic"], "yolov8", SIZE, CLASSES, ladder, {"score_threshold": THRESHOLD})
    fp32 = planted_outlier(ladder, tmp_path / "student.onnx", PLANTED)
    (tmp_path / "student.head.json").write_text((tmp_path / "ladder.head.json").read_text())
    data = composited("digits", 96, 64, CanvasSpec(seed=3, **CANVAS))
    cfg = DetectionQuantizeConfig(calibration_methods=["max"], resamples=50, calib_images=96,
                                  accuracy_budget_points=1.0, compare_box_head=False)
    ctx = SimpleNamespace(recipe=SimpleNamespace(quantize=cfg, start=True))
    inputs = network_inputs(data.test.images, SIZE)
    task = DetectionLadder(ctx, tmp_path, fp32, network_inputs(data.train.images, SIZE), data.train, SIZE, inputs,
                           data.test, [str(k) for k in range(CLASSES)], [(SIZE, SIZE)] * len(inputs), "fp16",
                           columns_first=True)
    try:
        reference, attempts, _ = climb(task, steps("ort", ["max"], qat=False, mixed=True), tmp_path, cfg.mixed_precision)
    except Exception as err:  # the budget may still be missed on 64 test canvases: the attempts are what is checked
        raise AssertionError(f"the ladder failed: {err}") from None
    plain, mixed = attempts
    assert plain["drop_points"] > 1.0, "the planted layer costs the plain rung its points"
    assert mixed["sensitivity"][0]["layer"] == PLANTED
    assert [layer["layer"] for layer in mixed["kept_layers"]][:1] == [PLANTED] and mixed["plain_rung_kept"] is None
    assert mixed["value"] > plain["value"]


def test_the_sensitivity_reads_a_yolov8_output_along_its_columns():
    """N×(4+C)×A: read along the last axis every anchor would be a "channel" mixing box pixels with class
    probabilities, and a class layer's error (one standard deviation on one class column) would vanish beside the
    boxes' spread; read along the columns it counts as that column's share."""
    from pipeline.tasks.detection.int8 import DetectionLadder

    rng = np.random.default_rng(0)
    reference = np.concatenate([rng.uniform(0, 64, (8, 4, 80)), rng.uniform(0, 0.05, (8, CLASSES, 80))], axis=1)
    off = reference.copy()
    off[:, 4] += reference[:, 4].std()
    by_columns = DetectionLadder.__new__(DetectionLadder)
    by_columns.columns_first = True
    by_anchors = DetectionLadder.__new__(DetectionLadder)
    by_anchors.columns_first = False
    assert by_columns.distortion([reference], [off]) == pytest.approx(1 / (4 + CLASSES), rel=1e-6)
    assert by_anchors.distortion([reference], [off]) < 0.01 * by_columns.distortion([reference], [off])


STAND_IN = '''
"""A stand-in for the ultralytics package (AGPL-3.0, kept out of EdgeFold's dependencies): YOLO(path).export writes
the ONNX file named by EDGEFOLD_TEST_EXPORT beside the checkpoint, as Ultralytics writes best.onnx beside best.pt."""
import os, shutil
from pathlib import Path


class YOLO:
    def __init__(self, path):
        self.path = Path(path)

    def export(self, format, dynamic):
        assert format == "onnx" and dynamic is True
        out = self.path.with_suffix(".onnx")
        shutil.copyfile(os.environ["EDGEFOLD_TEST_EXPORT"], out)
        return str(out)
'''


def test_model_equals_a_checkpoint_is_exported_with_the_users_own_ultralytics(exports, tmp_path, monkeypatch):
    """MODEL=best.pt: without ultralytics the fix names the export command; with it (a stand-in here) EdgeFold runs
    that export, says so, and starts from the ONNX; an export newer than the checkpoint is used again."""
    import importlib.util

    from pipeline.core.recipe import load_recipe

    _, files, _ = exports
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"an Ultralytics checkpoint (never unpickled by EdgeFold)")
    if importlib.util.find_spec("ultralytics") is None:
        with pytest.raises(ConfigError, match="the ultralytics package that makes it is not importable") as caught:
            load_recipe(str(checkpoint), {"data.source": "digits-det"})
        assert f"yolo export model={checkpoint} format=onnx dynamic=True" in caught.value.fix
        assert f"MODEL={tmp_path / 'best.onnx'}" in caught.value.fix
    package = tmp_path / "site" / "ultralytics"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setenv("EDGEFOLD_TEST_EXPORT", str(files["dynamic"]))
    said = []
    monkeypatch.setattr("pipeline.core.log.log", said.append)
    recipe, path, _ = load_recipe(str(checkpoint), {"data.source": "digits-det"})
    assert path == tmp_path / "best.onnx" and recipe.start.outputs == "yolov8" and recipe.input_size() == SIZE
    assert "exporting with your ultralytics package (as yolo export model=" in said[0] and "dynamic=True" in said[0]
    load_recipe(str(checkpoint), {"data.source": "digits-det"})
    assert "using " in said[1] and "delete it to export again" in said[1]

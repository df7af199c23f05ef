"""A detector brought as ONNX in Ultralytics' output layouts (YOLOv8/11, YOLOv5/7, end-to-end): checked, decoded by
the device's post-processing as Ultralytics decodes it, its box branch traced from the graph, and run through the
detection ladder to its report. The ONNX files are built here (tests/pipeline/yolo_layouts.py), never downloaded."""

import json

import numpy as np
import pytest
import torch
import yaml

from device.scoring.detection_post import HeadSpecError, head_spec_from_dict, load_head_spec, postprocess
from device.errors import ConfigError
from pipeline.tasks.detection.export import network_inputs, sidecar_path
from pipeline.tasks.detection.metrics import Boxes, accumulate, match, summary
from pipeline.tasks.detection.box_branch import traced_box_branch
from pipeline.tasks.detection.onnx_start import inspect_detection_start, write_detection_start
from tests.pipeline.yolo_layouts import (CANVAS, CLASSES, SIZE, export_layout, independent_decode, trained_fcos,
                                        yolo_recipe)
from tests.slow import slow_fixture

LAYOUTS = ("yolov8", "yolov5", "end2end")
THRESHOLD = 0.05  # the tiny detector's scores are low: Ultralytics' 0.25 would keep too few boxes to test with


@pytest.fixture(scope="module")
@slow_fixture
def yolo_files(tmp_path_factory):
    """One trained tiny FCOS exported in the three layouts (about 20 s), with test canvases as network inputs."""
    from pipeline.tasks.detection.data import CanvasSpec, composited

    folder = tmp_path_factory.mktemp("yolo")
    detector = trained_fcos()
    files = {layout: export_layout(detector, layout, folder / f"{layout}.onnx") for layout in LAYOUTS}
    test = composited("digits", 8, 48, CanvasSpec(seed=7, **CANVAS)).test
    return folder, detector, files, test


def _started(files, layout, folder):
    out = folder / f"{layout}.ladder.onnx"
    facts, written = write_detection_start(files[layout], layout, None, CLASSES, out,
                                           {"score_threshold": THRESHOLD})
    return out, facts, written


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_device_decodes_each_layout_as_ultralytics_does(yolo_files, layout):
    folder, _, files, test = yolo_files
    out, facts, written = _started(files, layout, folder)
    assert facts.rows == (64 if layout == "end2end" else 80) and written["opset"] == 17
    import onnxruntime as ort

    inputs = network_inputs(test.images, SIZE)
    session = ort.InferenceSession(str(files[layout]), providers=["CPUExecutionProvider"])
    raw = session.run(None, {"images": inputs})[0]
    mine = postprocess(load_head_spec(sidecar_path(out)), raw)
    theirs = independent_decode(raw, layout, conf=THRESHOLD, **({"iou": 0.45, "max_det": 1000} if layout == "yolov5" else {}))
    assert sum(len(d["scores"]) for d in mine) > len(test.images), "the detector finds boxes"
    for found, (boxes, scores, labels) in zip(mine, theirs):
        order = np.lexsort((found["boxes"][:, 0], -found["scores"]))
        other = np.lexsort((boxes[:, 0], -scores))
        assert np.allclose(found["scores"][order], scores[other], atol=1e-6)
        assert np.allclose(found["boxes"][order], boxes[other], atol=1e-4)
        assert np.array_equal(found["labels"][order], labels[other])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_box_branch_is_traced_from_the_graph_and_kept_in_fp16(yolo_files, layout, tmp_path):
    import onnx

    from pipeline.quantize.fp16_nodes import fp16_nodes
    from pipeline.quantize.ladder import Step
    from pipeline.tasks.detection.int8 import quantize_detector

    folder, _, files, test = yolo_files
    out, _, written = _started(files, layout, folder)
    branch = traced_box_branch(onnx.load(str(out)), columns_last=layout != "yolov8")
    convs = [name for name in branch if name.endswith("/Conv")]
    # The box regression convolutions, and neither the class tower nor the centerness (which scores use).
    assert convs and all("bbox_reg" in name for name in convs), convs
    assert not any("classification_head" in name or "ctrness" in name for name in branch if "Conv" in name)
    assert written["box_branch_nodes"] == len(branch)
    calibration = network_inputs(test.images[:16], SIZE)
    facts = quantize_detector(Step("ort", "max"), out, tmp_path / "int8.onnx", calibration, True, "fp16", tmp_path)
    halves = fp16_nodes(onnx.load(str(tmp_path / "int8.onnx")))
    assert halves and halves <= set(branch) and facts["box_nodes_float"] == len(branch)


def test_a_layout_that_does_not_fit_is_refused_with_the_one_it_looks_like(yolo_files):
    _, _, files, _ = yolo_files
    with pytest.raises(ConfigError, match=r"looks like start.outputs: yolov5") as caught:
        inspect_detection_start(files["yolov5"], "yolov8", None, CLASSES)
    assert "[1, 80, 15]" in caught.value.message
    with pytest.raises(ConfigError, match=r"N×A×16"):  # the data has another class count
        inspect_detection_start(files["yolov5"], "yolov5", None, CLASSES + 1)


def test_raw_logits_are_refused_as_not_a_yolo_export(tmp_path):
    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4 + CLASSES, 8, stride=8)

        def forward(self, x):
            return 50 * self.conv(x).flatten(2)  # N×14×64, class columns far outside [0, 1]

    path = tmp_path / "logits.onnx"
    torch.onnx.export(Logits(), (torch.zeros(1, 3, SIZE, SIZE),), str(path), dynamo=False, input_names=["images"],
                      output_names=["output0"])
    with pytest.raises(ConfigError, match=r"probabilities in \[0, 1\]"):
        inspect_detection_start(path, "yolov8", None, CLASSES)


def test_an_old_opset_is_converted_and_a_batch_fixed_inside_is_refused_with_the_export_flag(yolo_files, tmp_path):
    _, detector, _, _ = yolo_files
    path = export_layout(detector, "yolov8", tmp_path / "old.onnx", opset=12)
    facts, written = write_detection_start(path, "yolov8", None, CLASSES, tmp_path / "ladder.onnx")
    assert facts.opset == 12 and written["changes"][0] == "opset 12 → 13"
    import onnx
    import onnxruntime as ort

    # The converter leaves nodes unnamed; the quantizer leaves nodes out by name, so each is named.
    assert all(node.name for node in onnx.load(str(tmp_path / "ladder.onnx")).graph.node)

    session = ort.InferenceSession(str(tmp_path / "ladder.onnx"), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": np.zeros((3, 3, SIZE, SIZE), np.float32)})[0].shape == (3, 4 + CLASSES, 80)
    # A static export bakes batch 1 into its reshapes (Ultralytics' default, dynamic=False): refused, with the flag.
    static = export_layout(detector, "yolov8", tmp_path / "static.onnx", dynamic=False)
    with pytest.raises(ConfigError, match="fixes its batch at 1 inside the graph") as caught:
        inspect_detection_start(static, "yolov8", None, CLASSES)
    assert "dynamic=True" in caught.value.fix


def test_the_sidecar_refuses_a_mixed_end_to_end_description():
    base = {"schema": "edgefold.detection_head/1", "num_classes": 2, "label_offset": 0, "anchors": [],
            "anchors_per_level": [], "rows": 5, "image_size": [64, 64], "box_coder": {"kind": "xyxy"},
            "layout": {"bbox_regression": [0, 4], "scores": [4, 5], "labels": [5, 6]}, "score": "final",
            "candidates": "per_box", "postprocess": {"score_threshold": 0.1, "iou_threshold": 0.5,
                                                     "max_detections": 5, "topk_candidates": 5}}
    with pytest.raises(HeadSpecError, match="final/final/xyxy together"):
        head_spec_from_dict(base)
    assert head_spec_from_dict({**base, "candidates": "final"}).rows == 5


def test_a_letterboxed_box_maps_back_to_the_original_image():
    from pipeline.tasks.detection.data import letterbox

    image = np.zeros((40, 100, 3), np.uint8)
    square, factor, (left, top) = letterbox(image, 64, "ultralytics")
    assert (left, top) == (0, 19) and factor == pytest.approx(0.64)
    assert (square[:19] == 114).all() and (square[19 + 26:] == 114).all() and (square[19:45] == 0).all()
    original = np.array([[10.0, 5.0, 60.0, 30.0]])
    on_network = original * factor + [left, top, left, top]
    spec = head_spec_from_dict({
        "schema": "edgefold.detection_head/1", "num_classes": 1, "label_offset": 0, "anchors": [],
        "anchors_per_level": [], "rows": 1, "image_size": [64, 64], "box_coder": {"kind": "xyxy"},
        "layout": {"bbox_regression": [0, 4], "scores": [4, 5], "labels": [5, 6]}, "score": "final",
        "candidates": "final", "resize": "letterbox", "postprocess": {
            "score_threshold": 0.1, "iou_threshold": 0.5, "max_detections": 5, "topk_candidates": 5}})
    raw = np.concatenate([on_network, [[0.9, 0.0]]], axis=1)[None].astype(np.float32)
    back = postprocess(spec, raw, [(40, 100)])[0]["boxes"]
    assert np.allclose(back, original, atol=1e-4)
    top_left, _, _ = letterbox(image, 64)  # EdgeFold's own: top-left on black
    assert (top_left[:26] == 0).all() and (top_left[26:] == 0).all()


def test_a_start_recipe_runs_no_torch_stage_and_refuses_what_needs_one(tmp_path):
    from pipeline.core.recipe import parse_recipe

    raw = {"name": "y", "data": {"source": "digits-det"}, "start": {"onnx": "m.onnx", "outputs": "yolov8",
                                                                     "task": "detection"}}
    recipe = parse_recipe(raw)  # start: {task: detection} makes it a detection recipe
    assert type(recipe).__name__ == "DetectionRecipe" and recipe.teacher is None
    assert recipe.data.letterbox == "ultralytics"
    with pytest.raises(ConfigError, match="teacher would not run"):
        parse_recipe({**raw, "teacher": {"arch": "tiny_fcos", "train": {"epochs": 1, "lr": 0.01}}})
    with pytest.raises(ConfigError, match="quantize.qat needs the PyTorch model"):
        parse_recipe({**raw, "quantize": {"qat": {"epochs": 1, "lr": 0.001}}})
    with pytest.raises(ConfigError, match="teacher: required; the detection ladder starts from a PyTorch teacher"):
        parse_recipe({"name": "y", "task": "detection", "data": {"source": "digits-det"}})
    tiny = yaml.safe_load(open("models/tiny-det.yaml"))
    assert parse_recipe(tiny).data.letterbox == "top_left"


def test_model_equals_a_detector_onnx_reads_its_layout_from_the_shape(yolo_files):
    from pipeline.core.recipe import load_recipe

    _, _, files, _ = yolo_files
    for layout in LAYOUTS:
        recipe, _, _ = load_recipe(str(files[layout]), {"data.source": "digits-det"})
        assert recipe.start.outputs == layout and recipe.data.canvas.size == SIZE
        assert f"read as {layout}" in recipe._preprocess_from


@pytest.fixture(scope="module")
@slow_fixture
def yolo_run(yolo_files, tmp_path_factory):
    """The YOLOv8-layout file through the whole detection ladder on a loopback agent (about 20 s)."""
    from pipeline.runner import run_pipeline

    _, _, files, _ = yolo_files
    folder = tmp_path_factory.mktemp("yolo-run")
    path = folder / "yolo-start.yaml"
    path.write_text(yaml.safe_dump(yolo_recipe(files["yolov8"])))
    ctx = run_pipeline(str(path), runs_dir=folder / "runs", new=True)
    return ctx.run_dir, json.loads((ctx.run_dir / "manifest.json").read_text()), files["yolov8"]


def test_a_yolo_detector_goes_through_the_ladder_to_its_report(yolo_run):
    run_dir, manifest, _ = yolo_run
    stages = manifest["stages"]
    assert list(stages) == ["data", "export", "quantize", "evaluate", "deploy", "report"]
    export = stages["export"]["metrics"]
    assert export["started"] and export["rungs"]["student"]["parity_max_abs_diff"] == 0.0
    assert export["rungs"]["student"]["macs_g"] > 0
    ladder = json.loads((run_dir / stages["evaluate"]["outputs"]["ladder"]).read_text())["rungs"]
    assert list(ladder)[:2] == ["student", "student_int8"] and "teacher" not in ladder
    deployed = json.loads((run_dir / stages["deploy"]["outputs"]["results"]).read_text())["devices"][0]["rungs"]
    assert {rung: r["state"] for rung, r in deployed.items()} == dict.fromkeys(ladder, "succeeded")
    assert deployed["student"]["scores"]["map"] > 0.01
    report = (run_dir / stages["report"]["outputs"]["md"]).read_text()
    assert "student_int8" in report and stages["quantize"]["metrics"]["box_head"] == "fp16"


def test_the_host_map_equals_an_independent_decode_of_the_raw_outputs(yolo_run):
    import onnxruntime as ort

    from pipeline.core.manifest import Manifest
    from pipeline.tasks.detection.files import load_split

    run_dir, manifest, given = yolo_run
    test = load_split(Manifest.load(run_dir).output("data", "canvases"), "test")
    session = ort.InferenceSession(str(given), providers=["CPUExecutionProvider"])
    raw = session.run(None, {"images": network_inputs(test.images, SIZE)})[0]
    found = [Boxes(boxes.astype(np.float64), labels, scores.astype(np.float64))
             for boxes, scores, labels in independent_decode(raw, "yolov8", conf=THRESHOLD)]
    theirs = summary(accumulate(match(test.boxes, found, CLASSES)))["map"]
    assert theirs > 0.01
    assert manifest["stages"]["export"]["metrics"]["rungs"]["student"]["scores"]["map"] == pytest.approx(theirs, abs=1e-9)
    assert manifest["stages"]["quantize"]["metrics"]["fp32"]["map"] == pytest.approx(theirs, abs=1e-9)


def test_a_graph_fed_otherwise_than_declared_is_stopped_with_the_key_that_fixes_it(yolo_files, yolo_run, tmp_path):
    """The same network in a graph that takes pixel values 0–255 (YOLOX's feed), declared 0–1: the export stage's
    feed probe on training canvases stops with both mAPs and start.input_range=0-255; with it, the graph scores what
    the 0–1 graph scored on the same test canvases."""
    from device.errors import StageError
    from pipeline.runner import run_pipeline

    folder, detector, _, _ = yolo_files
    path = export_layout(detector, "yolov8", tmp_path / "pixels.onnx", pixel_values=True)
    recipe = tmp_path / "pixels.yaml"
    recipe.write_text(yaml.safe_dump(yolo_recipe(path)))
    with pytest.raises(StageError, match=r"scores mAP .* as declared and .* with pixels in 0-255") as caught:
        run_pipeline(str(recipe), runs_dir=tmp_path / "runs", new=True, until="export")
    assert "start.input_range=0-255" in caught.value.fix and "start.channel_order" not in caught.value.fix
    ctx = run_pipeline(str(recipe), runs_dir=tmp_path / "runs", new=True, until="export",
                       overrides={"start.input_range": "0-255"})
    rung = json.loads((ctx.run_dir / "manifest.json").read_text())["stages"]["export"]["metrics"]["rungs"]["student"]
    assert not rung["feed_probe"]["better"]
    _, manifest, _ = yolo_run
    as_trained = manifest["stages"]["export"]["metrics"]["rungs"]["student"]["scores"]["map"]
    assert rung["scores"]["map"] == pytest.approx(as_trained, abs=0.005)
    probe = manifest["stages"]["export"]["metrics"]["rungs"]["student"]["feed_probe"]
    assert [t["label"] for t in probe["tried"]] == ["declared", "BGR channel order", "pixels in 0-255"]


def test_the_shipped_yolo_detector_letterboxes_as_ultralytics_and_maps_boxes_back(yolo_run, tmp_path):
    """infer.py of the shipped rung (no EdgeFold on its path) feeds a YOLO start centred on grey 114: on the test
    canvases it scores the run's mAP; a canvas in a 64×96 frame is letterboxed and its boxes mapped back to the frame
    as the data stage and the device's post-processing do."""
    import subprocess
    import sys

    import cv2

    from pipeline.ship.bundle import ship
    from pipeline.tasks.detection.ship import DetectionShip

    run_dir, _, _ = yolo_run
    hooks = DetectionShip()
    folder = ship(run_dir, hooks, rung="student", to=tmp_path / "bundle", log=lambda _: None)
    assert json.loads((folder / "preprocess.json").read_text())["kind"] == "letterbox_ultralytics"
    from pipeline.ship.deepstream import parse_config

    keys = parse_config((folder / "deepstream" / "config_infer.txt").read_text())["property"]
    assert keys["symmetric-padding"] == "1" and keys["maintain-aspect-ratio"] == "1"  # centred, as it was trained
    card = json.loads((folder / "card.json").read_text())
    assert card["deepstream"]["accuracy"] == pytest.approx(card["deepstream"]["host_accuracy"], abs=1e-9)
    paths = hooks.write_test_images(run_dir, tmp_path / "images")
    canvas = cv2.imread(str(paths[0]))
    wide = np.full((64, 96, 3), 114, np.uint8)
    wide[:, 16:80] = canvas  # the canvas in a wider frame: shrunk to fit the square, grey above and below
    cv2.imwrite(str(tmp_path / "wide.png"), wide)
    for target, out in ((tmp_path / "images", "answers.json"), (tmp_path / "wide.png", "wide.json")):
        result = subprocess.run([sys.executable, str(folder / "infer.py"), str(target), "--json", str(tmp_path / out)],
                                capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin"},
                                cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    answers = json.loads((tmp_path / "answers.json").read_text())
    row = next(r for r in hooks.rows(run_dir) if r.rung == "student")
    assert hooks.score_answers(run_dir, answers) == pytest.approx(row.accuracy, abs=1e-9)
    # The 64×96 frame letterboxed as the data stage letterboxes COCO images for a YOLO start, decoded by the device's
    # post-processing back to the frame's pixels: what the standalone infer.py answered.
    import onnxruntime as ort

    from device.scoring.detection_post import load_head_spec, postprocess
    from pipeline.tasks.detection.data import letterbox

    square, _, _ = letterbox(cv2.cvtColor(wide, cv2.COLOR_BGR2RGB), SIZE, "ultralytics")
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    raw = session.run(None, {"input": square.transpose(2, 0, 1)[None].astype(np.float32) / 255})[0]
    from pipeline.core.manifest import Manifest

    head = Manifest.load(run_dir).output("export", "student_head")
    expected = postprocess(load_head_spec(head), raw, [(64, 96)])[0]
    (wide_answer,) = json.loads((tmp_path / "wide.json").read_text()).values()
    assert len(expected["boxes"]) and np.allclose(np.asarray(wide_answer["boxes"]), expected["boxes"], atol=1e-3)
    assert np.asarray(wide_answer["boxes"])[:, [0, 2]].max() > 64, "boxes in the 96-px frame, past the square"


def test_on_a_coco_set_the_probe_also_tries_the_other_letterbox(yolo_files, tmp_path):
    """A YOLO start on a COCO set of mixed sizes: the images are letterboxed as Ultralytics does (centred on grey
    114), and the feed probe scores the same training images letterboxed EdgeFold's way too."""
    from pipeline.runner import run_pipeline
    from tests.pipeline.test_detection_coco import write_coco

    _, _, files, _ = yolo_files
    annotations = write_coco(tmp_path / "coco", 60)
    recipe = yolo_recipe(files["yolov8"])
    recipe["data"] = {"source": f"coco:{annotations}", "train_images": 40, "test_images": 12, "canvas": {"size": SIZE}}
    recipe["start"]["preprocess_check"] = "warn"  # which letterbox wins on these black frames is not the point
    path = tmp_path / "coco.yaml"
    path.write_text(yaml.safe_dump(recipe))
    ctx = run_pipeline(str(path), runs_dir=tmp_path / "runs", new=True, until="export")
    manifest = json.loads((ctx.run_dir / "manifest.json").read_text())
    assert manifest["stages"]["data"]["metrics"]["generator"]["letterbox_style"] == "ultralytics"
    probe = manifest["stages"]["export"]["metrics"]["rungs"]["student"]["feed_probe"]
    assert probe["images"] == 40 and probe["declared"]["data.letterbox"] == "ultralytics"
    assert [t["label"] for t in probe["tried"]] == ["declared", "BGR channel order", "pixels in 0-255",
                                                    "top_left letterbox"]
    assert all(0 <= t["map"] <= 1 for t in probe["tried"])


class _Planted(torch.nn.Module):
    """A graph whose output is planted columns (N×A×6): what a layout check must read."""

    def __init__(self, columns):
        super().__init__()
        self.columns = columns
        self.conv = torch.nn.Conv2d(3, 1, 8, stride=8)

    def forward(self, x):
        rows = torch.sigmoid(self.conv(x).flatten(1))[..., None]  # N×64×1, in (0, 1)
        return torch.cat([column(rows) for column in self.columns], dim=2)


def _planted(tmp_path, name, columns):
    path = tmp_path / name
    torch.onnx.export(_Planted(columns), (torch.zeros(1, 3, SIZE, SIZE),), str(path), dynamo=False,
                      input_names=["images"], output_names=["output0"], dynamic_axes={"images": {0: "batch"}})
    return path


def test_boxes_left_in_the_heads_terms_are_refused_with_the_decode_flag(tmp_path):
    """YOLOX exported without --decode_in_inference: sigmoid scores (they pass), but grid offsets and log sizes."""
    offsets, log_size = (lambda r: r), (lambda r: torch.log(r))
    path = _planted(tmp_path, "raw.onnx", [offsets, offsets, log_size, log_size, offsets, offsets])
    with pytest.raises(ConfigError, match="boxes are not decoded to input pixels") as caught:
        inspect_detection_start(path, "yolov5", None, 1)
    assert "--decode_in_inference" in caught.value.fix and "export.py --weights" in caught.value.fix


def test_a_one_class_yolov5_output_declared_end_to_end_is_named(tmp_path):
    """N×A×6 is both a one-class YOLOv5 output and an end-to-end one: a class column of probabilities tells them
    apart."""
    pixels = lambda r: 64 * r  # noqa: E731
    path = _planted(tmp_path, "one-class.onnx", [pixels, pixels, pixels, pixels, lambda r: r, lambda r: r])
    with pytest.raises(ConfigError, match="not indices of the data's 1 classes") as caught:
        inspect_detection_start(path, "end2end", None, 1)
    assert "it looks like start.outputs: yolov5" in caught.value.fix
    assert inspect_detection_start(path, "yolov5", None, 1).rows == 64


@pytest.mark.parametrize("shape, layout", [([1, 84, 8400], "yolov8"), ([1, 25200, 85], "yolov5"),
                                           ([1, 300, 6], "end2end"), ([1, 25200, 6], "yolov5"),
                                           ([None, 14, None], "yolov8"), ([None, None, 6], "end2end")])
def test_model_equals_reads_the_layout_from_the_output_shape(shape, layout, tmp_path):
    from pipeline.core.onnx_recipe import _detector_recipe

    raw, said = _detector_recipe(tmp_path / "absent.onnx", "m", 640, shape)
    assert raw["start"]["outputs"] == layout and f"read as {layout}" in said


def test_yolo_boxes_are_clipped_after_nms_as_ultralytics_does():
    """Two boxes past the right edge overlap by IoU 0.75 as decoded (Ultralytics keeps one at iou 0.7), by 0.5
    once clipped to 640 (two would be kept)."""
    spec = head_spec_from_dict({
        "schema": "edgefold.detection_head/1", "num_classes": 1, "label_offset": 0, "anchors": [],
        "anchors_per_level": [], "rows": 2, "image_size": [640, 640], "box_coder": {"kind": "cxcywh"},
        "layout": {"bbox_regression": [0, 4], "cls_logits": [4, 5]}, "score": "probability", "candidates": "per_box",
        "transpose": False, "postprocess": {"score_threshold": 0.25, "iou_threshold": 0.7, "max_detections": 300,
                                            "topk_candidates": 30000}})
    raw = np.array([[[640, 50, 120, 100, 0.9], [655, 50, 90, 100, 0.8]]], np.float32)  # [580, 700] and [610, 700]
    (found,) = postprocess(spec, raw)
    assert len(found["scores"]) == 1 and found["boxes"][0].tolist() == [580, 0, 640, 100]


def test_the_shipped_detectors_infer_py_takes_a_threshold_and_a_maximum(yolo_run, tmp_path):
    """infer.py's --score-threshold and --max-detections default to the thresholds the rung was scored at (said in
    its help); set, they bound every image's answer."""
    import subprocess
    import sys

    from pipeline.ship.bundle import ship
    from pipeline.tasks.detection.ship import DetectionShip

    run_dir, _, _ = yolo_run
    hooks = DetectionShip()
    folder = ship(run_dir, hooks, rung="student", to=tmp_path / "bundle", log=lambda _: None)
    hooks.write_test_images(run_dir, tmp_path / "images")
    run = lambda *extra: subprocess.run(  # noqa: E731
        [sys.executable, str(folder / "infer.py"), *extra], capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    helped = run("--help")
    assert f"default {THRESHOLD}: what the rung's mAP was measured at" in " ".join(helped.stdout.split())
    assert run(str(tmp_path / "images"), "--json", str(tmp_path / "all.json")).returncode == 0
    done = run(str(tmp_path / "images"), "--json", str(tmp_path / "few.json"), "--score-threshold", "0.3",
               "--max-detections", "2")
    assert done.returncode == 0, done.stderr
    every, few = (json.loads((tmp_path / name).read_text()) for name in ("all.json", "few.json"))
    assert sum(len(a["scores"]) for a in every.values()) > sum(len(a["scores"]) for a in few.values())
    assert all(len(a["scores"]) <= 2 and all(s >= 0.3 for s in a["scores"]) for a in few.values())
    assert run(str(tmp_path / "images"), "--score-threshold", "1.5").returncode == 2

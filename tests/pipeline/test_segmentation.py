"""Semantic segmentation, the third task, made of hooks alone: its data, metrics and device post-processor, then
tiny-seg end to end through the shared stages on a loopback agent (real job processes, ONNX Runtime)."""

from __future__ import annotations

import csv
import json
import re
import subprocess

import numpy as np
import pytest

from device.errors import ConfigError, StageError
from pipeline.tasks.segmentation.data import CLASSES, canvases
from pipeline.tasks.segmentation.metrics import class_changes, require_sane, score_masks
from tests.slow import slow_fixture


def test_the_canvases_are_the_same_for_a_seed_and_their_masks_hold_every_class():
    one, again, other = (canvases(16, 32, (1, 3), 0.3, seed) for seed in (0, 0, 1))
    assert np.array_equal(one.images, again.images) and np.array_equal(one.masks, again.masks)
    assert not np.array_equal(one.masks, other.masks)
    assert set(np.unique(one.masks)) <= set(range(len(CLASSES))) and len(np.unique(one.masks)) > 1
    empty = canvases(4, 32, (0, 0), 0.3, 0)
    assert not empty.masks.any(), "no shape drawn: all background"


def test_miou_is_one_for_a_perfect_mask_and_its_interval_holds_the_point():
    truth = canvases(24, 32, (1, 3), 0.3, 2).masks
    perfect = score_masks(truth, truth, CLASSES, resamples=50)
    assert perfect["miou"] == perfect["miou_low"] == perfect["miou_high"] == 1.0
    worse = truth.copy()
    worse[:8] = 0  # a third of the images lose their shapes
    scored = score_masks(truth, worse, CLASSES, resamples=100)
    assert scored["miou_low"] <= scored["miou"] <= scored["miou_high"] < 1.0
    assert scored["per_class_iou"]["background"] < 1.0


def test_the_per_class_test_finds_a_class_that_was_lost_and_not_the_others():
    truth = canvases(40, 32, (1, 3), 0.3, 3).masks
    after = truth.copy()
    after[after == CLASSES.index("square")] = 0  # every square missed
    rows = {row["class"]: row for row in class_changes(truth, truth, after, CLASSES, resamples=100)}
    assert rows["square"]["change_points"] == -100.0 and rows["square"]["significant"]
    assert rows["circle"]["change_points"] == 0.0 and not rows["circle"]["significant"]


def test_a_segmenter_that_finds_no_object_is_refused():
    truth = canvases(8, 32, (1, 3), 0.3, 4).masks
    with pytest.raises(StageError, match="predicts no object pixel"):
        require_sane(score_masks(truth, np.zeros_like(truth), CLASSES, resamples=0), "the teacher")


def test_masks_travel_packed_and_a_truncated_pack_is_refused():
    from device.scoring.segmentation_evaluation import pack_masks, unpack_masks

    masks = canvases(6, 32, (1, 3), 0.3, 5).masks
    packed = pack_masks(masks)
    assert np.array_equal(unpack_masks(packed, masks.shape), masks) and len(packed) < masks.size / 4
    with pytest.raises(ValueError, match="bytes"):
        unpack_masks(packed, (7, 32, 32))


@pytest.mark.parametrize("change, named", [
    ({"data": {"source": "voc:"}}, "voc: needs the folder"),
    ({"data": {"source": "shapes-sg"}}, "did you mean 'shapes-seg'"),
    ({"start": {"onnx": "model.onnx"}}, "segmenter brought as ONNX is not taken"),
    ({"quantize": {"qat": {"epochs": 1, "batch_size": 8, "lr": 0.0001}}}, "no QAT step yet"),
    ({"teacher": {"arch": "tiny_sg", "train": {"epochs": 1, "batch_size": 8}}}, "tiny_seg"),
    ({"deploy": {"sweep": {"modes": "all"}}}, "deploy.sweep is not taken by this task: a power-mode sweep"),
    ({"deploy": {"job_timeout_s": 600}}, "here the key is deploy.timeout_s"),
    ({"deploy": {"frame": {"source": "images"}}}, "here frames are timed, not scored: source: synthetic"),
    ({"deploy": {"sustained": {"minutes": 1, "swept": True}}}, "swept follows a power sweep"),
    ({"deploy": {"sustained": {"minutes": 1, "rung": "pruned"}}}, "'pruned' is not deployed")])
def test_what_segmentation_does_not_offer_is_refused_with_the_reason(repo, change, named):
    import yaml

    from pipeline.core.recipe import parse_recipe

    raw = yaml.safe_load((repo / "models" / "tiny-seg.yaml").read_text())
    for section, values in change.items():
        raw[section] = {**(raw.get(section) or {}), **values}
    with pytest.raises(ConfigError, match=re.escape(named)):
        parse_recipe(raw, "tiny-seg.yaml")


@pytest.fixture(scope="module")
@slow_fixture
def seg_run(repo, tmp_path_factory):
    """tiny-seg end to end on a loopback agent, with fewer epochs and resamples, a small camera frame and a 3-second
    sustained run (about 40 s on two cores)."""
    from pipeline.runner import run_pipeline

    runs = tmp_path_factory.mktemp("seg-runs")
    overrides = {"teacher.train.epochs": 6, "distill.train.epochs": 2, "quantize.resamples": 50,
                 "deploy.resamples": 50, "deploy.iterations": 5, "deploy.warmup_iterations": 1,
                 "deploy.frame": {"width": 160, "height": 90, "format": "jpeg", "frames": 4, "rounds": 2},
                 "deploy.sustained": {"minutes": 0.05, "record_every_s": 0.5}}
    ctx = run_pipeline(str(repo / "models" / "tiny-seg.yaml"), runs_dir=runs, new=True, overrides=overrides)
    return ctx, json.loads(ctx.manifest.path.read_text())


def test_every_stage_of_a_segmentation_run_is_a_shared_stage_with_segmentations_hooks(seg_run):
    from pipeline import tasks
    from pipeline.core.stage import STAGE_ORDER, HookedStage

    ctx, manifest = seg_run
    assert list(manifest["stages"]) == list(STAGE_ORDER) and manifest["task"] == "segmentation"
    task = tasks.of_run(ctx.run_dir)
    assert task.name == "segmentation" and task.score == "miou"
    for stage in STAGE_ORDER:
        found = task.stages.get(stage)
        assert type(found).__module__.startswith("pipeline.stages."), f"{stage} is the shared stage"
        if isinstance(found, HookedStage):
            assert type(found.hooks).__module__.startswith("pipeline.tasks.segmentation."), stage


def test_the_ladder_record_has_every_tasks_shape_and_the_students_macs_share(seg_run):
    ctx, manifest = seg_run
    ladder = json.loads((ctx.run_dir / manifest["stages"]["evaluate"]["outputs"]["ladder"]).read_text())
    assert ladder["score"] == "miou" and ladder["baseline"] == "teacher" and ladder["classes"] == list(CLASSES)
    assert list(ladder["rungs"]) == ["teacher", "student", "student_int8"]
    for rung, row in ladder["rungs"].items():
        assert {"precision", "artifact", "size_mb", "macs_g", "miou", "miou_delta_points"} <= set(row), rung
        assert row["miou_low"] <= row["miou"] <= row["miou_high"], rung
        assert (ctx.run_dir / row["artifact"]).suffix == ".onnx"
    prune = ctx.recipe.prune
    assert abs(ladder["rungs"]["student"]["macs_fraction"] - prune.macs_target) <= prune.tolerance * prune.macs_target
    assert ladder["rungs"]["teacher"]["miou"] > 0.3, "the teacher learned the shapes"


def test_the_device_scores_each_rung_through_the_engine_it_timed(seg_run):
    """ONNX Runtime on the loopback agent runs the same INT8 graph the host scored: the argmax on the device gives
    the same masks, so the same mIoU to the last digit; the FP32 rungs agree with torch within the export check."""
    ctx, manifest = seg_run
    stages = manifest["stages"]
    ladder = json.loads((ctx.run_dir / stages["evaluate"]["outputs"]["ladder"]).read_text())
    deploy = json.loads((ctx.run_dir / stages["deploy"]["outputs"]["results"]).read_text())
    (device,) = deploy["devices"]
    assert stages["deploy"]["metrics"]["jobs_succeeded"] == stages["deploy"]["metrics"]["jobs"] == 3
    for rung, measured in device["rungs"].items():
        assert measured["state"] == "succeeded" and measured["network_p50"]["rounds"] == ctx.recipe.deploy.rounds
        assert measured["postprocess_ms_per_image"] > 0 and measured["scores"]["images"] == deploy["images"]
    assert device["rungs"]["student_int8"]["scores"]["miou"] == pytest.approx(ladder["rungs"]["student_int8"]["miou"],
                                                                               abs=1e-12)
    assert device["rungs"]["student"]["scores"]["miou"] == pytest.approx(ladder["rungs"]["student"]["miou"], abs=5e-3)
    assert "vs_student" in device["rungs"]["student_int8"] and "vs_student" not in device["rungs"]["student"]


def test_the_report_writes_every_tasks_results_and_opens_with_its_headline(seg_run):
    from pipeline.report.results import RESULTS_SCHEMA
    from pipeline.tasks.segmentation.report import RESULT_COLUMNS

    ctx, manifest = seg_run
    outputs = manifest["stages"]["report"]["outputs"]
    document = json.loads((ctx.run_dir / outputs["json"]).read_text())
    assert document["schema"] == RESULTS_SCHEMA and document["task"] == "segmentation"
    headline = document["headline"]
    assert headline["measured"] and headline["rung"] in ("student_int8", "student")
    # As every task's: against the teacher (on loopback, the one device, said so), paired by round.
    teacher = next(row for row in document["rows"] if row["rung"] == "teacher")
    assert headline["dc_device"] == "loopback" and headline["latency_p50_ms_dc"] == teacher["latency_p50_ms"]
    assert headline["latency_ratio_low"] <= headline["latency_ratio"] <= headline["latency_ratio_high"]
    assert 0 < headline["macs_ratio"] < 1 and "no data-center device" in headline["note"]
    with open(ctx.run_dir / outputs["csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0])[:len(RESULT_COLUMNS)] == list(RESULT_COLUMNS) and len(rows) == 3
    assert "latency_p50_ms" in rows[0] and "not_recorded" in rows[0], "the declared measured fields, as every task's"
    page = (ctx.run_dir / outputs["html"]).read_text()
    first_table = re.search(r"<table[^>]*>", page).group(0)
    assert "headline" in first_table, "the headline is the page's first table"
    markdown = (ctx.run_dir / outputs["md"]).read_text()
    assert markdown.index("## Headline") < markdown.index("## The ladder") < markdown.index("## Where the time goes"), \
        "every task's page, in its order, with the device's per-layer time as every task's"


def test_the_segmentation_report_fits_a_1366_px_page(seg_run):
    from tests.browser import render_probe

    ctx, manifest = seg_run
    page = ctx.run_dir / manifest["stages"]["report"]["outputs"]["html"]
    check = ("const tables=[...document.querySelectorAll('table')];document.title=[tables.length,"
             "tables.filter(t=>t.getBoundingClientRect().right<=window.innerWidth).length,"
             "document.documentElement.scrollWidth<=window.innerWidth,tables[0].className].join(':')")
    tables = len(re.findall("<table", page.read_text()))
    assert render_probe(page, check, 1366) == f"{tables}:{tables}:true:headline"


def test_a_second_run_trains_nothing_and_measures_nothing_again(seg_run, capsys):
    from pipeline.runner import run_pipeline

    ctx, manifest = seg_run
    again = run_pipeline(manifest["recipe"]["path"], runs_dir=ctx.run_dir.parent.parent, run_id=ctx.run_dir.name,
                         overrides=manifest.get("overrides") or {})
    err = capsys.readouterr().err
    assert "running" not in err.replace("[  deploy] running", "").replace("[  report] running", "")
    deploy = again.manifest.stage("deploy")["metrics"]
    assert deploy["jobs_reused"] == deploy["jobs"] * deploy["rounds"]


def test_a_camera_frame_is_timed_to_its_mask_and_reported_as_every_tasks_frame(seg_run):
    """deploy.frame on a segmentation run: round 1 of each rung times a JPEG frame's path to its mask on the device
    (the segmentation post-processor named in the job), with the preprocessing also written into each rung's graph;
    the page, results.json and results.csv carry it as classification's do."""
    ctx, manifest = seg_run
    stages = manifest["stages"]
    deploy = json.loads((ctx.run_dir / stages["deploy"]["outputs"]["results"]).read_text())
    assert sorted(deploy["frame"]["in_graph"]) == ["student", "student_int8", "teacher"]
    for rung, record in deploy["devices"][0]["rungs"].items():
        spec = record["spec"]
        assert spec["frame"]["postprocess"] == "segmentation" and spec["frame"]["in_graph"], rung
        assert spec["preprocess"]["input_size"] == spec["preprocess"]["resize"] == 64, rung
        frame = record["frame"]
        assert frame["frame_spec"] == "160×90 jpeg" and frame["frame_postprocess"] == "segmentation", rung
        assert frame["frame_agreement"] == 1.0 and "frame_error" not in frame, rung
        assert 0 < frame["frame_engine_ms"] < 10 * frame["frame_total_ms"] and frame["frame_fps_pipelined"] > 0
        assert frame["frame_in_graph_total_ms"] > 0 and not frame.get("frame_in_graph_error"), rung
    report = (ctx.run_dir / stages["report"]["outputs"]["md"]).read_text()
    assert "## Where the frame's time goes" in report and "timed from a camera frame's bytes to its mask" in report
    assert "post-processing (the argmax over classes)" in report and "Preprocessing in the graph" in report
    with (ctx.run_dir / stages["report"]["outputs"]["csv"]).open() as handle:
        rows = list(csv.DictReader(handle))
    assert all(float(row["frame_total_ms"]) > 0 and row["frame_spec"] == "160×90 jpeg" for row in rows)


def test_the_deployed_student_runs_without_pause_after_the_ladder_and_is_reported_as_every_tasks(seg_run):
    """deploy.sustained on a segmentation run: after the ladder's rounds the INT8 student runs for its minutes on
    each device, recorded per interval; the page's "After N minutes", the row's sustained_* figures in results.csv."""
    ctx, manifest = seg_run
    stages = manifest["stages"]
    deploy = json.loads((ctx.run_dir / stages["deploy"]["outputs"]["results"]).read_text())
    sustained = deploy["devices"][0]["sustained"]
    assert sustained["rung"] == "student_int8" and sustained["state"] == "succeeded", sustained.get("error")
    assert sustained["spec"]["sustained"]["minutes"] == 0.05 and sustained["spec"]["batch_sizes"] == [1]
    intervals = sustained["result"]["sustained"]["intervals"]
    assert len(intervals) >= 4 and all(i["latency_p50_ms"] > 0 for i in intervals)
    report = (ctx.run_dir / stages["report"]["outputs"]["md"]).read_text()
    assert "## After 0.05 minutes" in report and "settled ÷ burst" in report
    with (ctx.run_dir / stages["report"]["outputs"]["csv"]).open() as handle:
        rows = {row["rung"]: row for row in csv.DictReader(handle)}
    assert float(rows["student_int8"]["sustained_minutes"]) == 0.05
    assert float(rows["student_int8"]["sustained_settled_p50_ms"]) > 0 and rows["student"]["sustained_minutes"] == ""


def test_edgefold_diverge_searches_a_segmentation_rung_on_the_images_the_device_scored(seg_run, tmp_path):
    """As for every task: the set rebuilt to the byte the deploy stage sent, the search answered and in the report."""
    from tests.pipeline.diverged import diverge_on_an_agent, run_copy, sent_set_digest

    copy = run_copy(seg_run[0].run_dir, tmp_path)
    for rung in ("student", "student_int8"):
        sent, rebuilt = sent_set_digest(copy, rung)
        assert sent == rebuilt, rung
    code, answer, report = diverge_on_an_agent(copy, tmp_path)
    assert code == 0 and answer["first_parting"] is None and answer["images"] == 3
    assert all(m["relative_error"] < 1e-4 for m in answer["probes"][0]["metrics"].values())
    assert "## Where the engine parts from the model" in report and "agrees with ONNX Runtime's on 3 images" in report


@pytest.mark.parametrize("arch", ["lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large"])
def test_torchvisions_segmenters_prune_reload_and_export_with_their_classifiers_whole(arch, tmp_path):
    """The real recipes' architectures through what tiny-seg's run does to its own: pruned (the classifiers kept
    whole), saved as state and rebuilt, a user's torchvision weights loaded, exported and checked against torch."""
    import torch

    from pipeline.export.onnx import check_parity, export_onnx
    from pipeline.tasks.segmentation.models import (SEGMENTERS, build_segmenter, load_segmenter,
                                                    load_segmenter_weights, save_segmenter)
    from pipeline.tasks.segmentation.pruned import _pruned_copy

    torch.manual_seed(0)
    model = build_segmenter(arch, 4).eval()
    torch.save(model.model.state_dict(), tmp_path / "user.pt")  # torchvision's own keys, as a user saves them
    fresh = build_segmenter(arch, 4).eval()
    load_segmenter_weights(fresh, tmp_path / "user.pt")
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
    widths = [tuple(layer.weight.shape) for layer in SEGMENTERS.get(arch).classifiers(model)]
    before = sum(p.numel() for p in model.parameters())
    _pruned_copy(model, arch, 0.3, 64, 8, "l2")
    assert sum(p.numel() for p in model.parameters()) < before
    assert [layer.weight.shape[0] for layer in SEGMENTERS.get(arch).classifiers(model)] == [w[0] for w in widths]
    path = save_segmenter(tmp_path / "model.pt", model, arch, 4, 64)
    loaded, meta = load_segmenter(path)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x)) and loaded(x).shape == (2, 4, 64, 64)
    export_onnx(loaded, tmp_path / "model.onnx", (1, 3, 64, 64), 17)
    assert check_parity(loaded, tmp_path / "model.onnx", x.numpy())["max_abs_diff"] < 1e-3


def test_a_segmentation_run_ships_and_its_folder_checks_against_its_card(seg_run, tmp_path):
    """edgefold ship on tiny-seg: infer.py, run from another directory by edgefold ship --check (with this
    interpreter; tests/pipeline/test_ship.py makes the fresh environment), writes each image's class map and overlay
    and scores the card's mIoU; nvinfer takes the argmax itself (network-type 2) over a graph ending in a Softmax
    over the classes, at threshold 0, so every pixel gets its class as mIoU counted it; Triton's schema parses."""
    import sys

    import cv2
    import onnx
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from pipeline.ship.bundle import ship
    from pipeline.ship.check import check
    from pipeline.ship.deepstream import NVINFER_KEYS, parse_config
    from pipeline.tasks.segmentation.ship import SegmentationShip, palette

    ctx, _ = seg_run
    hooks = SegmentationShip()
    folder = ship(ctx.run_dir, hooks, rung="student_int8", to=tmp_path / "bundle", log=lambda _: None)
    post = json.loads((folder / "postprocess.json").read_text())
    assert post["kind"] == "segmentation" and post["classes"] == list(CLASSES)
    assert post["palette"][:3] == [[0, 0, 0], [128, 0, 0], [0, 128, 0]], "VOC's colour map"
    assert len({tuple(c) for c in palette(21)}) == 21
    assert json.loads((folder / "preprocess.json").read_text())["kind"] == "stretch"
    record = check(folder, hooks, python=sys.executable, log=lambda _: None)
    row = next(r for r in hooks.rows(ctx.run_dir) if r.rung == "student_int8")
    assert record["passed"] and record["score"] == row.accuracy and record["images"] == 64

    image = np.random.default_rng(0).integers(0, 256, (45, 70, 3), np.uint8)  # not the network's square
    cv2.imwrite(str(tmp_path / "photo.png"), image)
    result = subprocess.run([sys.executable, str(folder / "infer.py"), str(tmp_path / "photo.png"), "--masks",
                             str(tmp_path / "masks"), "--json", str(tmp_path / "answers.json")], capture_output=True,
                            text=True, timeout=300, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    answer = json.loads((tmp_path / "answers.json").read_text())[str(tmp_path / "photo.png")]
    mask = cv2.imread(answer["mask"], cv2.IMREAD_UNCHANGED)
    assert mask.shape == (45, 70) and mask.max() < len(CLASSES), "class indices at the image's own size"
    assert cv2.imread(answer["overlay"]).shape == (45, 70, 3) and sum(answer["shares"].values()) == pytest.approx(1)

    keys = parse_config((folder / "deepstream" / "config_infer.txt").read_text())["property"]
    assert all(key in NVINFER_KEYS and NVINFER_KEYS[key](value) for key, value in keys.items())
    assert keys["network-type"] == "2" and keys["segmentation-threshold"] == "0.0"
    assert keys["num-detected-classes"] == str(len(CLASSES)) and keys["maintain-aspect-ratio"] == "0"
    graph = onnx.load(str(folder / "deepstream" / "model.onnx")).graph
    last = graph.node[-1]
    assert last.op_type == "Softmax" and next(a.i for a in last.attribute if a.name == "axis") == 1
    card = json.loads((folder / "card.json").read_text())
    assert card["deepstream"]["accuracy"] == pytest.approx(card["deepstream"]["host_accuracy"], abs=1e-9), \
        "nvinfer's stretch is EdgeFold's feed: on the run's square canvases the scores are one"
    (model,) = list((folder / "triton").iterdir())
    config = text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert list(config.input[0].dims) == [3, 64, 64] and len(config.output[0].dims) == 3  # C×H×W, batch apart


def test_the_deepstream_app_draws_the_class_map_nvinfer_attaches(seg_run, tmp_path, monkeypatch):
    """deepstream/app.py for a segmenter on the GStreamer/pyds STAND-IN (tests/pipeline/deepstream_standin.py):
    deepstream-segmentation's pipeline (nvinfer → nvsegvisual at the frame's size), and its probe reads nvinfer's
    class map (the argmax over the DeepStream graph's probabilities) into each class's share of the frame, as
    infer.py counts them."""
    import onnxruntime as ort

    from pipeline.ship.bundle import ship
    from pipeline.tasks.segmentation.ship import SegmentationShip
    from tests.pipeline import deepstream_standin as standin

    ctx, _ = seg_run
    hooks = SegmentationShip()
    folder = ship(ctx.run_dir, hooks, rung="student", to=tmp_path / "bundle", log=lambda _: None)
    pipeline, probe, kept = standin.built_app(folder, monkeypatch, "rtsp://camera/stream", 64, 64)
    assert pipeline.chain() == ["nvstreammux", "nvinfer", "nvvideoconvert", "nvsegvisual", "nveglglessink"]
    visual = next(e for e in pipeline.elements if e.factory == "nvsegvisual")
    mux = next(e for e in pipeline.elements if e.factory == "nvstreammux")
    assert (visual.properties["width"], visual.properties["height"]) == (64, 64) and mux.properties["live-source"] == 1
    session = ort.InferenceSession(str(folder / "deepstream" / "model.onnx"), providers=["CPUExecutionProvider"])
    images = hooks._test(ctx.run_dir).images[:4]
    maps = [session.run(None, {session.get_inputs()[0].name: image.transpose(2, 0, 1)[None].astype(np.float32)
                               / 255.0})[0][0].argmax(0).astype(np.int32) for image in images]
    standin.run_probe(probe, [standin.frame(i, class_map=m) for i, m in enumerate(maps)])
    for class_map, answer in zip(maps, kept):
        shares = np.bincount(class_map.reshape(-1), minlength=len(CLASSES)) / class_map.size
        assert answer["shares"] == {CLASSES[k]: round(float(shares[k]), 4) for k in np.argsort(-shares)
                                    if shares[k] > 0}

"""The detection stages built so far: data → teacher → prune recorded in the manifest, then a clear stop."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.tasks.detection.files import load_split, save_splits
from pipeline.tasks.detection.checkpoint import load_detector, save_detector
from pipeline.tasks.detection.metrics import Boxes
from pipeline.tasks.detection.data import DetectionSplit
from pipeline.tasks.detection.models import build_detector
from pipeline.tasks.detection.pruning import prune_with_ratio
from tests.slow import slow_fixture


def test_canvases_round_trip_with_images_without_boxes(tmp_path):
    split = DetectionSplit(np.arange(3 * 4 * 4, dtype=np.uint8).reshape(3, 4, 4),
                           [Boxes(np.array([[0.0, 0, 2, 2]]), np.array([1])), Boxes.empty(),
                            Boxes(np.array([[1.0, 1, 3, 3], [0, 0, 1, 1]]), np.array([0, 2]))])
    path = save_splits(tmp_path / "c.npz", {"test": split})
    back = load_split(path, "test")
    assert np.array_equal(back.images, split.images) and [len(b.labels) for b in back.boxes] == [1, 0, 2]
    assert back.boxes[2].labels.tolist() == [0, 2] and back.boxes[2].xyxy.tolist() == [[1, 1, 3, 3], [0, 0, 1, 1]]


def test_a_pruned_detector_checkpoint_reloads_with_its_widths(tmp_path):
    torch.manual_seed(0)
    model = prune_with_ratio(build_detector("tiny_fcos", 3), "tiny_fcos", 0.5, 64, round_to=4).eval()
    path = save_detector(tmp_path / "m.pt", model, "tiny_fcos", 3, 64)
    loaded, meta = load_detector(path)
    assert meta["arch"] == "tiny_fcos" and loaded.backbone.stages[-1][0].out_channels == 24
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model.head(list(model.backbone(x).values()))["cls_logits"]
        after = loaded.head(list(loaded.backbone(x).values()))["cls_logits"]
    assert torch.equal(before, after)


@pytest.fixture(scope="module")
@slow_fixture
def det_run(repo, tmp_path_factory):
    """tiny-det with fewer canvases, epochs and resamples and a small camera frame, end to end on a loopback agent
    (about 60 s on two cores)."""
    from pipeline.runner import run_pipeline

    runs = tmp_path_factory.mktemp("det-runs")
    overrides = {"data.train_images": 512, "teacher.train.epochs": 4, "teacher.train.lr": 0.003,
                 "distill.train.epochs": 1, "quantize.resamples": 50, "deploy.resamples": 50,
                 "deploy.iterations": 5, "deploy.warmup_iterations": 1,
                 "deploy.frame": {"width": 96, "height": 80, "format": "nv12", "frames": 4, "rounds": 2}}
    ctx = run_pipeline(str(repo / "models" / "tiny-det.yaml"), runs_dir=runs, new=True, overrides=overrides)
    manifest = json.loads(next(runs.glob("tiny-det/*/manifest.json")).read_text())
    return ctx.run_dir, manifest


def test_edgefold_runs_lists_a_detection_run_by_its_own_score(det_run):
    """The listing asks the run's task for its score: mAP for detection, not a top-1 column left blank."""
    from pipeline.runner import list_runs

    run_dir, manifest = det_run
    row = next(r for r in list_runs(run_dir.parent.parent) if r["run"] == str(run_dir))
    assert row["score"] == "mAP"
    assert row["teacher_score"] == manifest["stages"]["teacher"]["metrics"]["map"] > 0
    assert row["student_score"] == manifest["stages"]["distill"]["metrics"]["map"] > 0


def test_detection_run_records_every_stage(det_run):
    _, manifest = det_run
    stages = manifest["stages"]
    assert list(stages) == ["data", "teacher", "prune", "distill", "export", "quantize", "evaluate", "deploy", "report"]
    assert stages["data"]["metrics"]["generator"]["source"] == "digits"
    teacher = stages["teacher"]["metrics"]
    assert teacher["ap50"] > 0.05 and teacher["map_low"] <= teacher["map_high"]
    losses = [epoch["loss"] for epoch in teacher["history"]]
    assert len(losses) == 4 and losses[-1] < 0.7 * losses[0], "the from-scratch detector learned"
    pruning = stages["prune"]["metrics"]["pruning"]
    assert abs(pruning["fraction"] - 0.6) <= 0.1 * 0.6
    assert [k["module"] for k in pruning["kept_whole"]][0] == "head.classification_head.cls_logits"
    assert stages["prune"]["metrics"]["macs_g"] < teacher["macs_g"]
    distill = stages["distill"]["metrics"]
    assert distill["with_teacher"] and distill["ap50"] > 0.05
    assert distill["macs_g"] == stages["prune"]["metrics"]["macs_g"]  # fine-tuning keeps the pruned widths
    rows = distill["class_changes_vs_teacher"]
    assert rows and all({"change_points", "change_low", "change_high", "p_holm"} <= set(row) for row in rows)


def test_detection_export_decodes_on_the_device_path_as_torchvision_did(det_run):
    _, manifest = det_run
    export = manifest["stages"]["export"]
    assert {"teacher", "teacher_head", "student", "student_head"} <= set(export["outputs"])
    for rung, stage in (("teacher", "teacher"), ("student", "distill")):
        m = export["metrics"]["rungs"][rung]
        assert m["parity_max_abs_diff"] < 1e-3
        assert abs(m["scores"]["map"] - manifest["stages"][stage]["metrics"]["map"]) < 0.01
        assert m["scores"]["timing"]["postprocess_ms"] > 0


def test_detection_int8_puts_the_box_head_in_fp16_and_records_what_each_setting_costs(det_run):
    """The default: the box branch out of Q/DQ and in FP16 (its nodes only), linted and int8-weights checked as a
    classifier's INT8 is, scoring as the FP32 box head does; float and int8 quantized beside it and recorded."""
    import onnx

    from device.runners.qdq_lint import lint_qdq
    from pipeline.tasks.detection.export import box_branch_nodes
    from pipeline.quantize.fp16_nodes import fp16_nodes
    from pipeline.quantize.int8_weights import float_weights

    run_dir, manifest = det_run
    quantize = manifest["stages"]["quantize"]
    m = quantize["metrics"]
    chosen = m["attempts"][-1]
    assert m["box_head"] == "fp16" and chosen["box_nodes_fp16"] > 0 and chosen["box_nodes_float"] > 0
    assert chosen["lint"]["ok"] and chosen["lint"]["float_layers"], "the box branch's layers stay out of Q/DQ"
    assert m["drop_points"] == pytest.approx(100 * (m["fp32"]["map"] - m["int8"]["map"]), abs=1e-3)
    assert m["drop_points"] <= 1.0, "within the recipe's mAP budget, or the stage would have failed"
    assert m["int8"]["map_low"] <= m["int8"]["map_high"] and m["int8"]["resamples"] == 50
    others = {other["box_head"]: other for other in m["other_box_heads"]}
    assert set(others) == {"float", "int8"}
    assert others["int8"]["box_nodes_float"] == 0 and not others["int8"]["lint"]["float_layers"]
    assert others["float"]["box_nodes_float"] == chosen["box_nodes_float"] and "box_nodes_fp16" not in others["float"]
    # The FP16 box head's promise: no measurable cost against the FP32 box head on the tiny set.
    assert abs(100 * (m["int8"]["map"] - others["float"]["scores"]["map"])) <= 0.5
    path = run_dir / quantize["outputs"]["student_int8"]
    halves = fp16_nodes(onnx.load(str(path)))
    assert halves and halves <= set(box_branch_nodes(path)), "FP16 in the box branch and nowhere else"
    assert lint_qdq(path).ok and float_weights(path) == []
    assert m["size_mb"] < others["float"]["size_mb"] < m["fp32_size_mb"], "FP16 box weights are half the size"
    assert {"student_int8", "student_int8_head", "student_int8_box_float", "student_int8_box_int8"} <= set(
        quantize["outputs"])


def test_a_users_detector_weights_load_with_a_head_for_other_classes(tmp_path):
    """A state saved from FrozenBatchNorm layers (no num_batches_tracked) loads into the prunable BatchNorm model;
    the class logits trained for 3 classes are left fresh for 5, and named."""
    from device.errors import CheckpointError
    from pipeline.tasks.detection.checkpoint import load_detector_weights

    torch.manual_seed(0)
    source = build_detector("tiny_fcos", 3)
    state = {k: v for k, v in source.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save({"model": state}, tmp_path / "w.pth")  # torchvision's reference scripts wrap it so
    target = build_detector("tiny_fcos", 5)
    replaced = load_detector_weights(target, "tiny_fcos", tmp_path / "w.pth")
    assert replaced == ["head.classification_head.cls_logits.weight", "head.classification_head.cls_logits.bias"]
    assert torch.equal(target.backbone.stages[0][0].weight, source.backbone.stages[0][0].weight)
    assert target.head.classification_head.cls_logits.out_channels == 5
    state["backbone.stages.0.0.weight"] = torch.zeros(8, 3, 3, 3)  # outside the head: refused, never reshaped
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError, match="other shapes"):
        load_detector_weights(build_detector("tiny_fcos", 5), "tiny_fcos", tmp_path / "bad.pth")


def test_detection_rungs_are_scored_on_the_loopback_agent_and_reported(det_run):
    """Every rung's device-measured mAP comes from the engine the agent timed, decoded there; with ONNX Runtime on
    both sides it equals the host's, and the report shows both with the post-processing's time apart."""
    run_dir, manifest = det_run
    ladder = json.loads((run_dir / manifest["stages"]["evaluate"]["outputs"]["ladder"]).read_text())["rungs"]
    assert set(ladder) == {"teacher", "student", "student_int8", "student_int8_box_float", "student_int8_box_int8"}
    results = json.loads((run_dir / manifest["stages"]["deploy"]["outputs"]["results"]).read_text())
    (device,) = results["devices"]
    assert device["status"] == "ok" and results["images"] == 128
    for rung, row in ladder.items():
        measured = device["rungs"][rung]
        assert measured["state"] == "succeeded", measured
        assert abs(measured["scores"]["map"] - row["map"]) < 1e-6, f"{rung}: the device ran what the host scored"
        assert measured["postprocess_ms_per_image"] > 0 and measured["network_ms_per_image"] > 0
    report = (run_dir / manifest["stages"]["report"]["outputs"]["md"]).read_text()
    assert "| student_int8 | int8 | " in report and "| student_int8 | fp16 | " in report, "ladder, then its detail"
    assert "decode + NMS ms/img" in report
    assert "## What each box-head setting costs" in report


def test_every_rung_is_timed_in_interleaved_rounds_with_its_ratio_to_the_fp32_student(det_run):
    from pipeline.stats import ratio_interval

    run_dir, manifest = det_run
    rounds = manifest["stages"]["deploy"]["metrics"]["rounds"]
    (device,) = json.loads((run_dir / manifest["stages"]["deploy"]["outputs"]["results"]).read_text())["devices"]
    student = device["rungs"]["student"]["latency_p50_windows_ms"]["1"]
    assert rounds == 3 and len(student) == rounds
    for rung, measured in device["rungs"].items():
        p50 = measured["network_p50"]
        assert p50["rounds"] == rounds and p50["low_ms"] <= p50["median_ms"] <= p50["high_ms"], rung
        # The declared latency field over the same rounds: the one computation the table, CSV and headline read.
        assert p50["median_ms"] == pytest.approx(float(np.median(measured["latency_p50_windows_ms"]["1"])))
        assert measured["reported"]["latency_p50_windows_ms"] == measured["latency_p50_windows_ms"]["1"]
        if rung == "student":
            assert "vs_student" not in measured
            continue
        versus = measured["vs_student"]
        # The ratio is paired by round: recomputed here from the windows the record keeps.
        assert (versus["ratio"], versus["low"], versus["high"]) == pytest.approx(
            ratio_interval(measured["latency_p50_windows_ms"]["1"], student))
    report = (run_dir / manifest["stages"]["report"]["outputs"]["md"]).read_text()
    assert f"median over {rounds} interleaved round(s)" in report and "× FP32 student [95% CI]" in report


def test_the_report_says_where_each_rungs_time_goes_from_the_engine_it_timed(det_run):
    """Round 1's per-layer profile (ONNX Runtime's profiler on the loopback agent) reaches the record and the
    report's "Where the time goes", one table per rung, its layers the profile's own."""
    run_dir, manifest = det_run
    (device,) = json.loads((run_dir / manifest["stages"]["deploy"]["outputs"]["results"]).read_text())["devices"]
    report = (run_dir / manifest["stages"]["report"]["outputs"]["md"]).read_text()
    assert "## Where the time goes" in report
    for rung, measured in device["rungs"].items():
        profile = measured["profile"]
        assert profile is not None, measured.get("profile_note")
        table = min(profile["batches"], key=lambda b: b["batch_size"])
        assert table["layers"] and table["total_ms"] > 0
        assert f"### {rung} on loopback (onnxruntime" in report
        assert table["layers"][0]["name"] in report  # the costliest layer is in its table


def test_a_second_run_reuses_every_measured_window(det_run, tmp_path, capfd):
    """The deploy stage always runs, but a round of a rung already measured with the same artifact, agent, code and
    job is read back from the run's deploy cache, not measured again."""
    import shutil

    from pipeline.runner import run_pipeline

    run_dir, manifest = det_run
    copy = tmp_path / "tiny-det" / run_dir.name
    shutil.copytree(run_dir, copy)
    ctx = run_pipeline(manifest["recipe"]["path"], runs_dir=tmp_path, run_id=run_dir.name,
                       overrides=manifest.get("overrides") or {})
    deploy = ctx.manifest.stage("deploy")["metrics"]
    assert deploy["jobs_reused"] == deploy["rounds"] * deploy["jobs"] and deploy["jobs_succeeded"] == deploy["jobs"]
    logged = capfd.readouterr().err
    assert (f"{deploy['jobs']}/{deploy['jobs']} rungs measured in {deploy['rounds']} interleaved rounds "
            f"({deploy['jobs_reused']} windows reused);") in logged, "the stage's own summary line"


def test_a_device_whose_fingerprint_changed_is_measured_again(det_run, tmp_path, monkeypatch):
    """The deploy cache's key holds the device's fingerprint (its TensorRT, power mode …): the same board after an
    upgrade reuses nothing (detection's key once lacked it and reused the old board's windows)."""
    import shutil

    from pipeline.deploy import session
    from pipeline.runner import run_pipeline

    run_dir, manifest = det_run
    shutil.copytree(run_dir, tmp_path / "tiny-det" / run_dir.name)
    real = session.fingerprint
    monkeypatch.setattr(session, "fingerprint", lambda info: {**real(info), "tensorrt": "10.3.0"})  # "upgraded"
    # One round: its windows are in the cache under the old fingerprint, so reusing any would show.
    ctx = run_pipeline(manifest["recipe"]["path"], runs_dir=tmp_path, run_id=run_dir.name,
                       overrides={**(manifest.get("overrides") or {}), "deploy.rounds": 1}, until="deploy")
    deploy = ctx.manifest.stage("deploy")["metrics"]
    assert deploy["rounds"] == 1 and deploy["jobs_reused"] == 0 and deploy["jobs_succeeded"] == deploy["jobs"]


def test_the_detection_benchmark_reads_every_rungs_figures_from_a_run(det_run):
    """bench/detection.py's record of a real run: host and device mAP per rung, timings, the box-head pair."""
    import importlib.util

    from pipeline.core.codehash import PROJECT_ROOT
    from pipeline.core.manifest import Manifest

    spec = importlib.util.spec_from_file_location("detection_bench", PROJECT_ROOT / "bench" / "detection.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run_dir, manifest = det_run
    record = bench.record(Manifest.load(run_dir), "distilled")
    assert record["student_fp32"]["map"] == manifest["stages"]["distill"]["metrics"]["map"]
    assert {row["box_head"] for row in record["host"].values() if row["box_head"]} == {"fp16", "float", "int8"}
    for rung, row in record["device"]["rungs"].items():
        assert row["state"] == "succeeded" and 0 <= row["map"] <= 1, rung
        assert row["network_ms_per_image"] > 0 and row["postprocess_ms_per_image"] > 0
    summary = bench.summarize({"distilled/0": record, "no_teacher/0": {"student_fp32": record["student_fp32"]}},
                              record["host"]["teacher"])
    assert summary["int8_box_fp16"]["minus_fp32_points"][0] == pytest.approx(
        100 * (record["host"]["student_int8"]["map"] - record["host"]["student"]["map"]))


def test_the_run_command_ends_a_detection_run_with_its_report(det_run, capsys):
    """`edgefold run` / `make edge MODEL=tiny-det` prints the detection report, not the classification ladder (it
    once crashed there, after every stage had run), and says where report.html is."""
    from types import SimpleNamespace

    from pipeline import tasks
    from pipeline.core.manifest import Manifest

    run_dir, _ = det_run
    tasks.get("detection").summary(SimpleNamespace(manifest=Manifest.load(run_dir), run_dir=run_dir))
    out = capsys.readouterr().out
    assert out.index("## Headline") < out.index("| rung | precision | device mAP [95% CI] | network p50 ms [95% CI]")
    assert f"report: {run_dir / 'report' / 'report.html'}" in out
    assert f"markdown: {run_dir / 'report' / 'report.md'}" in out


def test_edgefold_report_rebuilds_a_detection_run_and_keeps_the_manifest_true(det_run, tmp_path, capsys):
    import shutil

    from device.files import sha256_file
    from pipeline import cli

    run_dir = tmp_path / "tiny-det" / det_run[0].name
    shutil.copytree(det_run[0], run_dir)
    (run_dir / "report" / "report.md").write_text("stale")
    assert cli.main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "student_int8 on loopback (onnxruntime) vs teacher FP32 on loopback\n  mAP            " in out and "html: " in out and "csv: " in out
    manifest = json.loads((run_dir / "manifest.json").read_text())
    entry = manifest["stages"]["report"]
    assert (run_dir / "report" / "report.md").read_text() != "stale"
    assert all(entry["sha256"][rel] == sha256_file(run_dir / rel) for rel in entry["outputs"].values())
    assert "rebuilt" in entry and not list(run_dir.glob(".report.*"))


def test_a_detection_run_reported_by_an_older_version_is_rebuilt_and_its_manifest_names_the_new_files(
        det_run, tmp_path, capsys):
    """An older run's report stage recorded report.md/.html/report.json under ``markdown``/``html``/``json`` and its
    manifest named no task: ``edgefold report`` finds the task, rebuilds, and the manifest's outputs and hashes are
    the new files; ``edgefold run``'s summary reads the older key too."""
    import shutil
    from types import SimpleNamespace

    from device.files import sha256_file
    from pipeline import cli, tasks
    from pipeline.core.manifest import Manifest

    run_dir = tmp_path / "tiny-det" / det_run[0].name
    shutil.copytree(det_run[0], run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest.pop("task", None)
    manifest["stages"]["report"]["outputs"] = {"markdown": "report/report.md", "html": "report/report.html",
                                               "json": "report/report.json"}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    tasks.get("detection").summary(SimpleNamespace(manifest=Manifest.load(run_dir), run_dir=run_dir))
    assert "## Headline" in capsys.readouterr().out
    assert cli.main(["report", str(run_dir)]) == 0
    entry = json.loads((run_dir / "manifest.json").read_text())["stages"]["report"]
    assert entry["outputs"] == {"md": "report/report.md", "html": "report/report.html",
                                "json": "report/results.json", "csv": "report/results.csv"}
    assert all(entry["sha256"][rel] == sha256_file(run_dir / rel) for rel in entry["outputs"].values())


def test_the_detection_headline_leads_with_a_rung_the_device_really_ran():
    """As classification's: INT8 leads only where its own profile on that device shows a compute layer in INT8; else
    the FP32 student measured there leads, and the headline says why and how to measure INT8."""
    from pipeline.tasks.detection.report import headline, headline_text
    from tests.pipeline.test_report import _profile

    keys = dict(role="edge", runtime="onnxruntime", map_low=0.1, map_high=0.2, latency_p50_low_ms=None,
                latency_p50_high_ms=None, ratio_low=1.8, ratio_high=2.0, ratio_significant=True,
                postprocess_ms_per_image=1.0, latency_batch=1, reason=None, status="measured", device="orin")
    rows = [{**keys, "rung": "student", "map": 0.17, "map_vs_student_points": 0.0, "latency_p50_ms": 1.0,
             "ratio_vs_student": None},
            {**keys, "rung": "student_int8", "map": 0.168, "map_vs_student_points": -0.2, "latency_p50_ms": 1.9,
             "ratio_vs_student": 1.9}]
    unfused = {"device": "orin", "rung": "student_int8", "status": "measured",
               "profile": _profile(("int8", "qdq", 0.6), ("fp32", None, 0.4))}
    lead = headline(rows, {"method": "max", "box_head": "fp16"}, [unfused])
    assert lead["rung"] == "student" and lead["int8_not_measured"]["device"] == "orin"
    text = headline_text(lead)
    assert text.startswith("student on orin (onnxruntime)") and "×1.9" not in text
    assert "student_int8 not measured as INT8 on orin: no compute layer ran in INT8" in text and "EDGE=" in text
    fused = {**unfused, "profile": _profile(("int8", None, 0.9), ("fp16", "reformat", 0.1))}
    assert headline(rows, {}, [fused])["rung"] == "student_int8"
    assert "×1.90 [1.80, 2.00] the FP32 student's (slower)" in headline_text(headline(rows, {}, [fused]))
    assert headline(rows, {}, [])["rung"] == "student_int8", "no profile: nothing says otherwise"


def test_the_headline_of_a_result_without_rounds_names_what_it_has():
    from pipeline.tasks.detection.report import headline_text

    text = headline_text({"rung": "student_int8", "measured": True, "device": "orin", "runtime": "tensorrt",
                          "map": 0.171, "map_low": None, "map_vs_student_points": 0.03, "latency_p50_ms": None,
                          "ratio_vs_student": None, "postprocess_ms_per_image": 0.9, "method": "max",
                          "box_head": "fp16"})
    assert text.splitlines()[:2] == ["student_int8 on orin (tensorrt)", "  mAP            17.1 on the device, +0.03 "
                                     "points against the FP32 student on the host"] and "p50" not in text


def _html_rows(page: str) -> list[list[str]]:
    """Every table row of an HTML page as its cells' text."""
    import html

    return [[html.unescape(cell) for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", page)]


def _points(scores: dict, key: str) -> str:
    return f"{100 * scores[key]:.1f} [{100 * scores[key + '_low']:.1f}, {100 * scores[key + '_high']:.1f}]"


def test_the_detection_report_html_shows_results_json_s_rungs_and_is_self_contained(det_run):
    """report.html: every rung's device mAP, AP50 and AP75 with intervals, host mAP, network and decode + NMS times,
    and the per-class changes with their Holm p, as results.json records them; no external resource; hashed."""
    from device.files import sha256_file

    run_dir, manifest = det_run
    report = manifest["stages"]["report"]
    page_path = run_dir / report["outputs"]["html"]
    assert report["sha256"][report["outputs"]["html"]] == sha256_file(page_path), "the manifest hashes report.html"
    page = page_path.read_text()
    data = json.loads((run_dir / report["outputs"]["json"]).read_text())
    headline, *tables = re.findall(r"<table.*?</table>", page, re.S)
    assert headline.startswith('<table class="headline"><caption>student')  # the page opens with the headline
    main, detail = ({row[0]: row for row in _html_rows(table)[1:]} for table in tables[:2])
    (device,) = data["deploy"]["devices"]
    assert f"{device['name']} ({device['runtime']}; {device['status']})" in page
    for rung, host in data["ladder"]["rungs"].items():
        measured = device["rungs"][rung]
        assert _points(host, "map") in detail[rung] and _points(measured["scores"], "map") in main[rung], rung
        for key in ("ap50", "ap75"):
            assert _points(measured["scores"], key) in detail[rung], (rung, key, detail[rung])
        assert main[rung][-1] == f"{measured['postprocess_ms_per_image']:.2f}"
        assert detail[rung][6] == f"{measured['network_ms_per_image']:.2f}"
    changes = data["quantize"]["class_changes_vs_fp32"]
    assert changes
    for change in changes:
        row = next(r for r in _html_rows(page) if r[:2] == [change["class"], str(change["boxes"])])
        assert row[4].startswith(f"{change['change_points']:+.2f}") and row[6] == f"{change['p_holm']:.3f}"
        assert row[5] == f"[{change['change_low']:+.2f}, {change['change_high']:+.2f}]"
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', page)) == 2, "both plots drawn inline"
    assert not re.search(r'(src|href)="(?!data:)', page) and "<link" not in page and "<script" not in page


def test_the_detection_report_html_fits_a_1366_px_page(det_run):
    """Rendered by Chromium 1366 px wide (a laptop's): the headline is the page's first table, both plots load, no
    table runs off the page, nothing scrolls sideways."""
    from tests.browser import render_probe

    run_dir, manifest = det_run
    check = ("const imgs=[...document.images];const tables=[...document.querySelectorAll('table')];"
             "document.title=[window.innerWidth,imgs.filter(i=>i.complete&&i.naturalWidth>300).length,"
             "tables.length,tables.filter(t=>t.getBoundingClientRect().right<=window.innerWidth).length,"
             "document.documentElement.scrollWidth<=window.innerWidth,tables[0].className].join(':')")
    tables = len(re.findall("<table", (run_dir / manifest["stages"]["report"]["outputs"]["html"]).read_text()))
    title = render_probe(run_dir / manifest["stages"]["report"]["outputs"]["html"], check, 1366)
    assert title == f"1366:2:{tables}:{tables}:true:headline"


def _rerun_detection_quantize(det_run, tmp_path, **overrides):
    """The quantize stage again on a copy of the module's tiny-det run, with recipe overrides."""
    import shutil

    from pipeline.runner import run_pipeline

    run_dir, _ = det_run
    shutil.copytree(run_dir, tmp_path / "tiny-det" / "again")
    overrides = {"data.train_images": 512, "teacher.train.epochs": 4, "teacher.train.lr": 0.003,
                 "distill.train.epochs": 1, "quantize.resamples": 50, "deploy.resamples": 50,
                 "deploy.iterations": 5, "deploy.warmup_iterations": 1, "quantize.compare_box_head": False, **overrides}
    return run_pipeline("tiny-det", runs_dir=tmp_path, run_id="again", force=["quantize"], until="quantize",
                        overrides=overrides)


def test_detection_climbs_the_shared_ladder_to_qat_when_calibration_misses(det_run, tmp_path, monkeypatch):
    """The classifier's ladder, now the detector's: the calibration candidate (scored as a collapse here, a planted
    miss) is recorded and the ladder goes on to QAT distilled from the FP32 student, whose INT8 ONNX passes the
    same checks and keeps the box branch FP16."""
    import onnx

    import pipeline.tasks.detection.onnx as detection_onnx
    from pipeline.tasks.detection.export import box_branch_nodes
    from pipeline.quantize.fp16_nodes import fp16_nodes
    from pipeline.quantize.int8_weights import float_weights

    real = detection_onnx.score_onnx_detector

    def planted(path, *args, **kwargs):
        scores, found = real(path, *args, **kwargs)
        if path.name == "student.int8.max.onnx":  # the planted miss: every box dropped
            scores = {**scores, "map": 0.0}
        return scores, found

    monkeypatch.setattr(detection_onnx, "score_onnx_detector", planted)
    # A budget the planted collapse misses and a working INT8 detector meets (the short fixture's FP32 mAP is low).
    fp32_points = 100 * det_run[1]["stages"]["export"]["metrics"]["rungs"]["student"]["scores"]["map"]
    budget = round(fp32_points - 0.5, 2)
    ctx = _rerun_detection_quantize(det_run, tmp_path, **{
        "quantize.calibration_methods": ["max"], "quantize.accuracy_budget_points": budget,
        "quantize.qat": {"epochs": 1, "batch_size": 32, "optimizer": "adamw", "lr": 1e-4},
        "quantize.mixed_precision": None})
    metrics = ctx.manifest.stage("quantize")["metrics"]
    assert [(a["quantizer"], a["method"]) for a in metrics["attempts"]] == [("ort", "max"), ("modelopt", "qat")]
    assert metrics["attempts"][0]["drop_points"] > budget and metrics["method"] == "qat"
    qat = metrics["attempts"][1]
    assert qat["lint"]["ok"] and qat["qat_steps"] == 16 and qat["box_nodes_fp16"] > 0
    assert qat["batchnorm_folded"] == 4, "the tiny backbone's four Conv-BN stages, folded before fake quantization"
    assert metrics["drop_points"] <= budget
    path = ctx.run_dir / ctx.manifest.stage("quantize")["outputs"]["student_int8"]
    assert float_weights(path) == [] and metrics["size_mb"] < metrics["fp32_size_mb"]
    graph = onnx.load(str(path))
    halves = fp16_nodes(graph)
    assert halves and halves <= set(box_branch_nodes(path)), "FP16 in the box branch and nowhere else"
    assert "BatchNormalization" not in {node.op_type for node in graph.graph.node}


def test_detection_keeps_its_most_sensitive_layers_in_fp16_when_calibration_misses(det_run, tmp_path, monkeypatch):
    """A planted miss of everything-INT8 (its test and held-out mAP scored as 0; said so): the mixed step ranks the
    quantized layers on held-out training canvases, keeps the fewest in FP16 that meet the budget there (k ≥ 1
    scored for real), and its candidate passes the test gate; the kept layers are named in the stage's metrics and
    FP16 in the graph."""
    import onnx

    import pipeline.tasks.detection.onnx as detection_onnx
    from pipeline.tasks.detection.export import box_branch_nodes
    from pipeline.quantize.fp16_nodes import fp16_nodes
    from pipeline.quantize.mixed_precision import quantized_layers

    real = detection_onnx.score_onnx_detector

    def planted(path, *args, **kwargs):
        scores, found = real(path, *args, **kwargs)
        if path.name in ("student.int8.max.onnx", "student.int8.mixed.k0.onnx"):  # test split, held-out slice
            scores = {**scores, "map": 0.0}
        return scores, found

    monkeypatch.setattr(detection_onnx, "score_onnx_detector", planted)
    fp32_points = 100 * det_run[1]["stages"]["export"]["metrics"]["rungs"]["student"]["scores"]["map"]
    ctx = _rerun_detection_quantize(det_run, tmp_path, **{
        "quantize.calibration_methods": ["max"], "quantize.accuracy_budget_points": round(fp32_points - 0.5, 2),
        "quantize.qat": None, "quantize.mixed_precision": {"max_layers": 4, "held_out": 0.25}})
    metrics = ctx.manifest.stage("quantize")["metrics"]
    assert [(a["quantizer"], a["method"]) for a in metrics["attempts"]] == [("ort", "max"), ("ort", "mixed")]
    mixed = metrics["attempts"][1]
    assert metrics["method"] == "mixed" and mixed["base_method"] == "max"
    assert mixed["held_out_images"] == 64 and mixed["calibration_images"] == 192, "a quarter of 256 canvases"
    kept = [layer["layer"] for layer in mixed["kept_layers"]]
    assert metrics["kept_layers"] == kept and 1 <= len(kept) <= 4 and metrics["kept_precision"] == "fp16"
    assert mixed["held_out_source"].startswith("training canvases")
    assert kept == [layer["layer"] for layer in mixed["sensitivity"][: len(kept)]], "the most sensitive first"
    path = ctx.run_dir / ctx.manifest.stage("quantize")["outputs"]["student_int8"]
    graph = onnx.load(str(path))
    halves, box = fp16_nodes(graph), set(box_branch_nodes(path))
    assert set(kept) <= halves and halves <= box | set(kept), "FP16: the box branch and the kept layers, nothing else"
    assert not set(kept) & set(quantized_layers(graph)), "the kept layers read no Q/DQ"
    assert mixed["lint"]["ok"] and 0 <= mixed["kept_macs_fraction"] < 1
    assert mixed["kept_macs"] == sum(layer["macs"] for layer in mixed["kept_layers"])


def test_detection_quantizes_with_modelopt_like_a_classifier(det_run, tmp_path):
    pytest.importorskip("modelopt.onnx.quantization", reason="ModelOpt is the [modelopt] extra (make installs it)")
    ctx = _rerun_detection_quantize(det_run, tmp_path, **{"quantize.quantizer": "modelopt",
                                                          "quantize.calibration_methods": ["max"],
                                                          "quantize.accuracy_budget_points": 100.0})
    metrics = ctx.manifest.stage("quantize")["metrics"]
    attempt = metrics["attempts"][0]
    assert (attempt["quantizer"], attempt["method"], attempt["float_islands"]) == ("modelopt", "max", "fp16")
    assert attempt["lint"]["ok"] and attempt["box_nodes_float"] > 0 and attempt["lint"]["float_layers"]
    assert metrics["int8"]["map"] > 0, "a real INT8 detector that finds boxes"


def test_a_detection_run_writes_the_same_results_document_as_a_classification_run(det_run):
    """results.json (schema, task, headline, one row per rung × device) and results.csv from the one writer
    (pipeline.report.results): the declared measured fields (peak power among them) reach the CSV and the ladder's detail."""
    import csv

    from pipeline.report.results import REPORTED, RESULTS_SCHEMA

    run_dir, manifest = det_run
    outputs = manifest["stages"]["report"]["outputs"]
    data = json.loads((run_dir / outputs["json"]).read_text())
    assert (data["schema"], data["task"]) == (RESULTS_SCHEMA, "detection")
    assert data["headline"]["measured"] and data["headline"]["rung"] == "student_int8"
    with open(run_dir / outputs["csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["rung"], r["device"]) for r in rows] == [(rung, "loopback") for rung in data["ladder"]["rungs"]]
    assert "power_peak_mw" in REPORTED and set(REPORTED) <= set(rows[0])
    int8 = next(r for r in rows if r["rung"] == "student_int8")
    assert float(int8["map"]) == pytest.approx(data["headline"]["map"]) and int8["status"] == "measured"
    assert 0 < float(int8["latency_p50_low_ms"]) <= float(int8["latency_p50_ms"]) <= float(int8["latency_p50_high_ms"])
    assert float(int8["throughput_images_per_s"]) > 0
    # The loopback agent has no power or GPU telemetry: an empty cell, never a zero; and nothing is "not recorded"
    # in a result of this version.
    assert (int8["power_peak_mw"], int8["gpu_freq_low_mhz"], int8["not_recorded"]) == ("", "", "")
    report = (run_dir / outputs["md"]).read_text()
    assert all(how.label in report for how in REPORTED.values()), "the detail table names every declared field"
    assert report.index("## Headline") < report.index("## The ladder") < report.index("### loopback")
    # The comparison every task's headline makes: the lead against the teacher, in the same rows as classification's.
    headline = report[report.index("## Headline"):report.index("## The ladder")]
    assert all(f"| {label} |" in headline for label in ("latency p50", "throughput", "energy/image", "compute")), \
        headline
    assert "vs teacher FP32 on loopback" in headline and data["headline"]["dc_device"] == "loopback"


def test_the_shipped_detector_answers_with_its_boxes_and_the_hosts_map(det_run, tmp_path):
    """edgefold ship on the detection run (tests/pipeline/test_ship.py has the classifier's): infer.py on the test
    canvases, decoding with the shipped detection_post.py, scores the mAP the run recorded for the rung; nvinfer gets
    network-type 100 with the raw tensor attached for the application to decode."""
    import subprocess
    import sys

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from pipeline.ship.bundle import ship
    from pipeline.ship.deepstream import NVINFER_KEYS, parse_config
    from pipeline.tasks.detection.ship import DetectionShip

    run_dir, _ = det_run
    hooks = DetectionShip()
    folder = ship(run_dir, hooks, rung="student_int8", to=tmp_path / "bundle", log=lambda _: None)
    card = json.loads((folder / "card.json").read_text())
    assert card["metric"] == "mAP" and (folder / "detection_post.py").is_file()
    hooks.write_test_images(run_dir, tmp_path / "images")
    result = subprocess.run([sys.executable, str(folder / "infer.py"), str(tmp_path / "images"), "--json",
                             str(tmp_path / "answers.json")], capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)  # no EdgeFold on its path: standalone
    assert result.returncode == 0, result.stderr
    answers = json.loads((tmp_path / "answers.json").read_text())
    assert all({"boxes", "scores", "labels", "classes"} <= set(a) for a in answers.values())
    row = next(r for r in hooks.rows(run_dir) if r.rung == "student_int8")
    assert hooks.score_answers(run_dir, answers) == pytest.approx(row.accuracy, abs=1e-9)
    keys = parse_config((folder / "deepstream" / "config_infer.txt").read_text())["property"]
    assert all(key in NVINFER_KEYS and NVINFER_KEYS[key](value) for key, value in keys.items())
    assert keys["network-type"] == "100" and keys["output-tensor-meta"] == "1" and keys["network-mode"] == "1"
    # EdgeFold's letterbox, as nvinfer does it: aspect kept, the image top-left. On the run's canvases (the network's
    # size) the two feeds are one, so the host scores the DeepStream graph as it scored the rung.
    assert keys["maintain-aspect-ratio"] == "1" and keys["symmetric-padding"] == "0"
    assert card["deepstream"]["accuracy"] == pytest.approx(card["deepstream"]["host_accuracy"], abs=1e-9)
    assert card["deepstream"]["graph_changes"] == [] and keys["model-engine-file"] == "model.plan", \
        "no engine came from a loopback agent: the card's trtexec line builds the plan"
    assert (folder / "deepstream" / "labels.txt").read_text().split("\n")[:2] == ["0", "1"]
    (model,) = list((folder / "triton").iterdir())
    config = text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert list(config.input[0].dims) == [3, 64, 64] and len(config.output[0].dims) == 2
    _the_deepstream_app_decodes_as_infer_py(folder, hooks, run_dir, answers, tmp_path)
    from pipeline.ship.check import check  # edgefold ship --check, with this interpreter (test_ship.py: a fresh one)

    record = check(folder, hooks, python=sys.executable, log=lambda _: None)
    assert record["passed"] and record["score"] == row.accuracy and "check" in json.loads((folder / "card.json")
                                                                                          .read_text())


def _the_deepstream_app_decodes_as_infer_py(folder, hooks, run_dir, answers, tmp_path):
    """deepstream/app.py on the GStreamer/pyds STAND-IN (tests/pipeline/deepstream_standin.py): fed the raw tensor
    nvinfer attaches for each test canvas, its probe decodes with the shipped detection_post.py and attaches object
    meta whose boxes are infer.py's for that image; for frames twice the size (nvinfer scales them back to the
    network's input), the boxes are twice as large: mapped back through nvinfer's scaling into frame pixels."""
    import importlib.util

    import onnxruntime as ort
    import pytest as _pytest

    from tests.pipeline import deepstream_standin as standin

    monkeypatch = _pytest.MonkeyPatch()
    try:
        spec = importlib.util.spec_from_file_location("shipped_infer_det_app", folder / "infer.py")
        infer = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(infer)
        pre = json.loads((folder / "preprocess.json").read_text())
        session = ort.InferenceSession(str(folder / "deepstream" / "model.onnx"), providers=["CPUExecutionProvider"])
        output = json.loads((folder / "postprocess.json").read_text())["outputs"][0]
        names = sorted(answers)[:8]
        tensors = []
        for name in names:
            fed, _ = infer.geometry(infer.read_rgb(Path(name)), pre)
            tensors.append(session.run(None, {session.get_inputs()[0].name: infer.normalize(fed[None], pre)})[0][0])
        size = pre["input_size"]
        for scale in (1, 2):
            pipeline, probe, kept = standin.built_app(folder, monkeypatch, "/dev/video0", size * scale, size * scale,
                                                      str(tmp_path / "out.mp4"))
            assert pipeline.chain() == ["nvstreammux", "nvinfer", "nvvideoconvert", "nvdsosd", "nvvideoconvert",
                                        "nvv4l2h264enc", "h264parse", "qtmux", "filesink"]
            frames = standin.run_probe(probe, [standin.frame(i, {output: t}) for i, t in enumerate(tensors)])
            for name, frame, answer in zip(names, frames, kept):
                expected = answers[name]
                assert answer["classes"] == expected["classes"] and np.allclose(answer["scores"], expected["scores"])
                assert np.allclose(np.asarray(answer["boxes"]).reshape(-1, 4),
                                   scale * np.asarray(expected["boxes"]).reshape(-1, 4), atol=1e-3)
                drawn = [[o.rect_params.left, o.rect_params.top, o.rect_params.left + o.rect_params.width,
                          o.rect_params.top + o.rect_params.height] for o in frame.objects]
                assert np.allclose(np.asarray(drawn).reshape(-1, 4), np.asarray(answer["boxes"]).reshape(-1, 4),
                                   atol=1e-3) and [o.obj_label for o in frame.objects] == expected["labels"]
        assert sum(len(answers[n]["boxes"]) for n in names) > 0, "the canvases hold objects the rung finds"
    finally:
        monkeypatch.undo()


def test_edgefold_diverge_searches_a_detection_rung_on_the_images_the_device_scored(det_run, tmp_path):
    """The search takes a detection run like a classification one: the task rebuilds the very set its deploy stage
    sent (the same bytes, by the round-1 job's sha256), the debug job names no post-processor, and the report of the
    run shows the answer."""
    from tests.pipeline.diverged import diverge_on_an_agent, run_copy, sent_set_digest

    copy = run_copy(det_run[0], tmp_path)
    sent, rebuilt = sent_set_digest(copy, "student_int8")
    assert sent == rebuilt
    code, answer, report = diverge_on_an_agent(copy, tmp_path)
    assert code == 0 and answer["first_parting"] is None and answer["images"] == 3 and answer["jobs"] == 1
    assert answer["tensors_in_order"] > 10
    assert all(m["relative_error"] < 1e-4 for m in answer["probes"][0]["metrics"].values())
    assert "## Where the engine parts from the model" in report and "agrees with ONNX Runtime's on 3 images" in report


def test_a_camera_frame_is_timed_to_its_boxes_by_the_sidecar_that_decodes_the_rung(det_run):
    """deploy.frame on a detection run: an NV12 frame's path to its boxes, decoded on the device by the sidecar round
    1 scores the set with (the detection post-processor named in the frame), in the rung's own feed; in the report."""
    run_dir, manifest = det_run
    deploy = json.loads((run_dir / manifest["stages"]["deploy"]["outputs"]["results"]).read_text())
    for rung, record in deploy["devices"][0]["rungs"].items():
        spec = record["spec"]
        assert spec["frame"]["postprocess"] == "detection" and spec["frame"]["format"] == "nv12", rung
        assert spec["evaluation"]["head"] and spec["preprocess"]["input_size"] == 64, rung
        frame = record["frame"]
        assert frame["frame_postprocess"] == "detection" and frame["frame_agreement"] == 1.0, rung
        assert frame["frame_postprocess_ms"] > 0 and frame["frame_total_ms"] > 0 and "frame_error" not in frame
    report = (run_dir / manifest["stages"]["report"]["outputs"]["md"]).read_text()
    assert "## Where the frame's time goes" in report and "bytes to its boxes" in report
    assert "post-processing (decode + NMS)" in report


def test_edgefold_sustain_runs_a_finished_detection_run_without_pause(det_run, tmp_path):
    """edgefold sustain takes a detection run (the task says it deploys again for it): the ladder's windows are
    reused, the INT8 student runs for its seconds on the device, and the rebuilt report shows it."""
    from pipeline.cli import main
    from tests.pipeline.diverged import run_copy

    copy = run_copy(det_run[0], tmp_path)
    assert main(["sustain", str(copy), "--minutes", "0.05", "--record-every-s", "0.5",
                 "--runs-dir", str(copy.parent.parent)]) == 0
    manifest = json.loads((copy / "manifest.json").read_text())
    deploy = json.loads((copy / manifest["stages"]["deploy"]["outputs"]["results"]).read_text())
    sustained = deploy["devices"][0]["sustained"]
    assert sustained["state"] == "succeeded" and len(sustained["result"]["sustained"]["intervals"]) >= 4
    assert all(rung["reused_rounds"] == 3 for rung in deploy["devices"][0]["rungs"].values()), "the ladder reused"
    report = (copy / manifest["stages"]["report"]["outputs"]["md"]).read_text()
    assert "## After 0.05 minutes" in report

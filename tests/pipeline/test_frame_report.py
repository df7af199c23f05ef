"""From camera frame to answer in the report: ``deploy.frame`` sends the frame to every rung's first-round job, and
the report shows where each frame's time goes (results.json, results.csv, report.md and .html, the headline)."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from device.errors import ConfigError
from device.jobs.frame_schema import FRAME_STAGES
from pipeline.core.recipe import load_recipe
from pipeline.deploy.frame_report import frame_headline


def test_a_bad_frame_in_the_recipe_is_refused_with_its_key():
    with pytest.raises(ConfigError) as err:
        load_recipe("tiny", {"deploy.frame.format": "nv12", "deploy.frame.height": 721})
    assert "deploy.frame: an NV12 frame has even width and height" in err.value.message
    with pytest.raises(ConfigError, match="deploy.frame.format"):
        load_recipe("tiny", {"deploy.frame.format": "h264"})


def test_the_headline_says_how_much_of_the_frame_is_outside_the_engine():
    row = {"frame_spec": "1920×1080 jpeg", "frame_total_ms": 20.0, "frame_engine_ms": 5.0, "frame_fps_pipelined": 66.0,
           "frame_bound_text": "decode bounds the frame rate: 66 fps pipelined (its thread alone ≈67, the engine "
                               "alone ≈200)"}
    assert frame_headline(row) == ("1920×1080 jpeg: 20.00 ms a frame one by one (75% outside the engine); decode "
                                   "bounds the frame rate: 66 fps pipelined (its thread alone ≈67, the engine alone "
                                   "≈200)")
    assert frame_headline({"frame_total_ms": None}) is None and frame_headline(None) is None


def test_the_headline_says_which_preprocessing_is_faster_and_the_whole_paths_top1():
    row = {"frame_spec": "1280×720 jpeg", "frame_total_ms": 2.0, "frame_engine_ms": 1.0, "frame_bound_text": "b",
           "frame_in_graph_total_ms": 3.7, "frame_in_graph_speedup": 0.54, "frame_in_graph_speedup_low": 0.5,
           "frame_in_graph_speedup_high": 0.6, "frame_top1": 0.9, "frame_top1_tensor": 0.92, "frame_top1_p": 0.031}
    assert frame_headline(row).endswith("; b; preprocessing 1.85× faster on the CPU [1.67, 2.00]; top-1 through the "
                                        "whole path 90.00% (tensor path 92.00%, McNemar p = 0.031)")
    row.update(frame_in_graph_speedup=1.5, frame_in_graph_speedup_low=1.25, frame_in_graph_speedup_high=1.75)
    assert "preprocessing 1.50× faster in the graph [1.25, 1.75]" in frame_headline(row)
    row.update(frame_in_graph_speedup_low=0.9)  # the rounds cannot tell the two apart: neither is named faster
    assert ("preprocessing in the graph or on the CPU: no measurable difference (CPU ÷ in-graph 1.50× [0.90, 1.75])"
            in frame_headline(row))


def test_make_edge_with_a_frame_ends_with_where_the_frames_time_goes(tiny_run, tmp_path):
    """The tiny run again with ``deploy.frame`` 640×360 JPEG made from the evaluation images: only deploy and the
    report run again, and only the first round's jobs (which carry the frame) are measured again; every rung has its
    parts, intervals and frame rates, both preprocessing forms with their paired ratio, and its top-1 through the
    whole path beside the tensor path's, in results.json and results.csv, and the section, figure and headline
    line."""
    from pipeline.runner import run_pipeline

    runs = tmp_path / "runs"
    shutil.copytree(tiny_run.run_dir, runs / "tiny" / "shared")
    before = json.loads((runs / "tiny" / "shared" / "manifest.json").read_text())["stages"]
    ctx = run_pipeline("tiny", run_id="shared", runs_dir=runs, overrides={
        "deploy.frame.width": 640, "deploy.frame.height": 360, "deploy.frame.format": "jpeg",
        "deploy.frame.frames": 8, "deploy.frame.rounds": 3, "deploy.frame.source": "images"})
    stages = ctx.manifest.data["stages"]
    for stage in ("teacher", "distill", "export", "quantize", "evaluate"):
        assert stages[stage] == before[stage], f"a frame spec re-ran {stage}"
    assert stages["deploy"]["metrics"]["jobs_reused"] == 5  # round 2 of each rung: unchanged, reused
    report = ctx.run_dir / "report"
    data = json.loads((report / "results.json").read_text())
    measured = [r for r in data["rows"] if r["status"] == "measured"]
    assert len(measured) == 5
    for row in measured:
        assert row["frame_spec"] == "640×360 jpeg" and row["frame_bound"] in FRAME_STAGES
        for part in (*FRAME_STAGES, "total"):
            assert row[f"frame_{part}_ms_low"] <= row[f"frame_{part}_ms"] <= row[f"frame_{part}_ms_high"]
        assert row["frame_decode_ms"] > 0 and row["frame_engine_ms"] > 0  # a JPEG is decoded; the engine runs
        assert row["frame_fps_pipelined"] > 0 and row["frame_fps_sequential"] > 0 and row["frame_batch"] == 1
        assert row["frame_in_graph_total_ms_low"] <= row["frame_in_graph_total_ms"] <= row["frame_in_graph_total_ms_high"]
        assert row["frame_in_graph_speedup_low"] <= row["frame_in_graph_speedup"] <= row["frame_in_graph_speedup_high"]
        assert row["frame_images"] == row["device_images"] and 0 <= row["frame_top1_p"] <= 1
        # The same engine on the same images: a 20×20 image through a 640×360 JPEG loses little
        assert abs(row["frame_top1"] - row["frame_top1_tensor"]) <= 0.05 and row["frame_top1_tensor"] == row["device_top1"]
    assert (runs / "tiny" / "shared" / "deploy" / "frame-student_int8.onnx").exists()
    assert data["frame_files"]["in_graph_difference"] <= 3 / 255 / 0.25  # the stated tolerance, checked on the run
    with open(report / "results.csv") as handle:
        table = list(csv.DictReader(handle))
    assert all(float(r["frame_total_ms"]) > 0 for r in table if r["status"] == "measured")
    markdown = (report / "report.md").read_text()
    assert "## Where the frame's time goes" in markdown and "| student_int8 | loopback | 640×360 jpeg |" in markdown
    assert " bounds the frame rate: " in markdown
    assert "| CPU path ms [95% CI] | in the graph ms [95% CI] |" in markdown
    assert "| tensor path top-1 | whole path top-1 | Δ points | McNemar p |" in markdown
    assert "| frame | 640×360 jpeg: " in markdown  # the headline's row
    html = (report / "report.html").read_text()
    assert "Where each frame&#x27;s time goes" in html or "Where each frame's time goes" in html
    # Shipped with the preprocessing in its graph (the form this run measured), and the frame figures on its card.
    from pipeline.ship.bundle import ship
    from pipeline.tasks.classification.ship import ClassificationShip

    folder = ship(ctx.run_dir, ClassificationShip(), rung="student_int8", to=tmp_path / "bundle", in_graph=True,
                  log=lambda _: None)
    preprocess = json.loads((folder / "preprocess.json").read_text())
    assert (folder / "model.frame.onnx").read_bytes() == (ctx.run_dir / "deploy" / "frame-student_int8.onnx").read_bytes()
    assert preprocess["in_graph"]["file"] == "model.frame.onnx" and preprocess["in_graph"]["input"]["dims"][-1] == 3
    card = json.loads((folder / "card.json").read_text())
    assert card["figures"]["frame_total_ms"] > 0 and "frame to answer" in (folder / "card.md").read_text()


def test_the_whole_path_is_compared_with_the_engine_of_its_own_batch():
    """TensorRT builds one engine per batch (each may choose other precisions): the frames ran at batch 1, so the
    tensor path they are compared with is batch 1's engine, not the largest batch's that ``evaluation`` holds; one
    model serving every batch (ONNX Runtime) is that model; another accelerator's engine never."""
    from types import SimpleNamespace as Scored

    from pipeline.deploy.frame_report import _same_engine

    largest, one, dla = Scored(batch_size=8, accelerator=None), Scored(batch_size=1, accelerator=None), \
        Scored(batch_size=1, accelerator="dla0")
    assert _same_engine(Scored(evaluation=largest, more_evaluations=[dla, one]), 1) is one
    assert _same_engine(Scored(evaluation=largest, more_evaluations=[]), 1) is largest
    assert _same_engine(Scored(evaluation=largest, more_evaluations=[dla]), 1) is largest
    assert _same_engine(Scored(evaluation=largest, more_evaluations=[Scored(batch_size=4, accelerator=None)]), 1) \
        is None


def test_a_frame_measured_with_power_and_copies_says_both(tmp_path):
    """A frame result as a Jetson's TensorRT job writes it (the board's power over the frame timing, the copies timed
    apart by CUDA events) reaches the row's columns and the section's notes; a mismatched image count is said, not
    compared."""
    from types import SimpleNamespace

    from device.jobs.frame import time_frames
    from device.jobs.frame_schema import FrameResult, FrameSpec
    from device.preprocess import Preprocess
    from device.runners import make_runner
    from pipeline.report.sections import to_markdown_lines
    from pipeline.deploy.frame_report import frame_fields, frame_section
    from pipeline.tasks.classification.device_accuracy import whole_path_scores
    from tests.device.agent_process import tiny_onnx

    preprocess = Preprocess(16, 18, 3, (0.5,) * 3, (0.25,) * 3)
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner:
        measured = time_frames(runner, preprocess, FrameSpec(width=32, height=24, frames=4, rounds=2))
    frame = FrameResult.model_validate({**measured, "copies_ms": {"h2d": 0.21, "d2h": 0.01}, "power": {
        "source": "jtop:VDD_IN", "mean_mw": 6100.0, "peak_mw": 6300.0, "window_s": 2.0, "energy_mj_per_frame": 1.5,
        "temp_peak_c": 48.5}})
    row = {"rung": "student", "device": "orin-nano",
           **frame_fields([SimpleNamespace(frame=frame, evaluation=None, more_evaluations=[])])}
    assert row["frame_power_w"] == 6.1 and row["frame_energy_mj"] == 1.5 and row["frame_copies_h2d_ms"] == 0.21
    text = "\n".join(to_markdown_lines(frame_section({"rows": [row]}, None)))
    assert ("student on orin-nano: 6.10 W (jtop:VDD_IN) over the frame timing, 1.50 mJ a frame (the window" in text
            and "host→device copy 0.210 ms, device→host 0.010 ms a frame" in text)
    scored = FrameResult.model_validate({**frame.model_dump(), "scores": {
        "artifact": "0" * 64, "images": 2, "top_k": 1, "predictions": [[0], [1]], "seconds": 0.1}})
    row = frame_fields([SimpleNamespace(frame=scored, evaluation=None, more_evaluations=[])],
                       whole_path_scores({"labels": [0, 1, 2]}, "student"))
    assert row["frame_scores_error"] == "the whole path scored 2 images, the evaluation set has 3: not compared"
    assert "frame_top1" not in row

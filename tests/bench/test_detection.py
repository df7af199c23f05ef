"""bench/detection.py: the goal judged as stated, every run shown, on planted records.

Reading a real run's figures is tested beside the detection run it reads (tests/pipeline/test_detection_stages.py).
"""

import math

import pytest


def _bench():
    import importlib.util

    from pipeline.core.codehash import PROJECT_ROOT

    spec = importlib.util.spec_from_file_location("detection_bench", PROJECT_ROOT / "bench" / "detection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scores(map_: float) -> dict:
    return {"map": map_, "map_low": map_ - 0.01, "map_high": map_ + 0.01, "ap50": 2 * map_}


def _records(int8_fp16_drop: float, int8_box_drop: float, teacher_gain: float, seeds: int = 4,
             default: str = "fp16") -> dict:
    """Per seed: the FP32 student at 0.30 + a per-seed offset; the INT8 rungs and the control arm offset from it.
    ``default`` is the box head of ``student_int8`` (``float`` for runs from before the FP16 box head); the FP32 box
    head sits 0.1 point below it."""
    out = {}
    for s in range(seeds):
        fp32 = 0.30 + 0.004 * s
        jitter = 0.0005 * ((s * 7) % 3)  # a paired difference that varies a little from seed to seed
        host = {"teacher": {**_scores(0.35), "box_head": None},
                "student": {**_scores(fp32), "box_head": None},
                "student_int8": {**_scores(fp32 - int8_fp16_drop / 100 + jitter), "box_head": default},
                "student_int8_box_int8": {**_scores(fp32 - int8_box_drop / 100 + jitter), "box_head": "int8"}}
        if default == "fp16":
            host["student_int8_box_float"] = {**_scores(fp32 - (int8_fp16_drop + 0.1) / 100 + jitter),
                                              "box_head": "float"}
        device = {rung: {"state": "succeeded", **scores, "latency_p50_ms": {"1": 0.5}, "network_ms_per_image": 1.0,
                         "postprocess_ms_per_image": 4.0} for rung, scores in host.items()}
        out[f"distilled/{s}"] = {"student_fp32": _scores(fp32), "with_teacher": True, "host": host,
                                 "device": {"name": "loopback", "runtime": "onnxruntime", "rungs": device},
                                 "significant_class_changes": ["3"] if s == 0 else []}
        out[f"no_teacher/{s}"] = {"student_fp32": _scores(fp32 - teacher_gain / 100 + jitter), "with_teacher": False}
    return out


def test_detection_bench_judges_the_int8_goal_by_the_lower_bound():
    bench = _bench()
    summary = bench.summarize(_records(0.2, 1.5, 2.0), _scores(0.35))
    mean, low, high = summary["int8_box_fp16"]["minus_fp32_points"]
    assert mean == pytest.approx(-0.2, abs=0.05) and low < mean < high
    assert summary["int8_box_float"]["minus_fp32_points"][0] == pytest.approx(-0.3, abs=0.05)
    assert summary["int8_box_int8"]["minus_fp32_points"][0] == pytest.approx(-1.5, abs=0.05)
    verdict = bench.judge(summary)
    assert verdict["met"] and "beats" in verdict["teacher"] and verdict["box_head"] == "fp16"
    # A mean within the budget whose interval reaches past it is missed: the lower bound decides.
    wide = _records(0.8, 1.5, -2.0)
    for s, sign in zip(range(4), (1, -1, 1, -1)):
        wide[f"distilled/{s}"]["host"]["student_int8"]["map"] -= sign * 0.006
    missed = bench.judge(bench.summarize(wide, _scores(0.35)))
    assert not missed["met"] and missed["int8_lower_bound_points"] < -1.0
    assert "WORSE" in missed["teacher"]


def test_detection_bench_shows_every_run_and_the_goal():
    bench = _bench()
    records = _records(0.2, 1.5, 2.0, seeds=2)
    summary = bench.summarize(records, _scores(0.35))
    text = bench.markdown({"design": {"recipe": "tiny-det", "seeds": 2}, "records": records, "failures": {
        "distilled/2": "StageError: planted"}, "summary": summary, "verdict": bench.judge(summary)})
    assert bench.GOAL in text and "**Goal MET**" in text
    rows = [line for line in text.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert len(rows) == 4, "every seed × arm is a row"
    assert "distilled/2: StageError: planted" in text, "a failed run is shown, not dropped"


def test_detection_bench_with_one_seed_does_not_judge_what_it_cannot():
    bench = _bench()
    summary = bench.summarize(_records(0.2, 1.5, 2.0, seeds=1), _scores(0.35))
    verdict = bench.judge(summary)
    assert not verdict["met"] and math.isnan(verdict["int8_lower_bound_points"])
    assert verdict["teacher"].startswith("not judged")


def test_detection_bench_judges_a_run_from_before_the_fp16_box_head_on_its_float_box_head():
    bench = _bench()
    summary = bench.summarize(_records(0.2, 1.5, 2.0, default="float"), _scores(0.35))
    assert "int8_box_fp16" not in summary, "no row of zeros for a setting the runs did not have"
    verdict = bench.judge(summary)
    assert verdict["box_head"] == "float" and verdict["int8_lower_bound_points"] == summary["int8_box_float"][
        "minus_fp32_points"][1]
    text = bench.markdown({"design": {"recipe": "tiny-det", "seeds": 4}, "records": _records(0.2, 1.5, 2.0, default="float"),
                           "failures": {}, "summary": summary, "verdict": verdict})
    assert "INT8 (box head float) − FP32" in text and "box head fp16" not in text

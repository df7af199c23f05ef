"""A degraded energy figure is marked, with its reason, in report.md, report.html and results.csv.

A hand-made run directory (evaluate metrics and one device's results, as deploy records them) keeps
this fast: the numbers are the agent's schema, the report reads nothing else."""

import csv
import json

from pipeline.deploy.devices import DEPLOY_SCHEMA
from pipeline.tasks.classification.report import build_report
from tests.results import job_result, run

REASON = "fresh samples cover 48% of the window (largest gap 1.06 s; need 95%)"


def summary(energy, degraded, reasons):
    return {"power_source": "jtop:VDD_IN", "power_mean_mw": 8000.0, "power_peak_mw": 9000.0, "power_idle_mw": 5000.0,
            "energy_mj_per_image": energy, "energy_above_idle_mj_per_image": None, "memory_source": None,
            "peak_memory_mb": 100.0, "energy_degraded": degraded, "energy_degraded_reasons": reasons,
            "energy_coverage": 0.48 if degraded else 1.0}


def result(energy, degraded, reasons):
    return job_result(runs=[run(summary=summary(energy, degraded, reasons))])


def test_degraded_energy_is_marked_in_every_output(tmp_path):
    rungs = {name: {"top1": 0.9, "params_m": 1.0, "macs_g": 0.1, "size_mb": 4.0} for name in ("teacher", "student")}
    device = {"name": "orin", "role": "edge", "url": "http://orin:8321", "status": "ok", "error": None, "info": {},
              "rungs": {"teacher": {"state": "succeeded", "spec": {"precision": "int8"},
                                    "result": result(16.0, False, {})},
                        "student": {"state": "succeeded", "spec": {"precision": "int8"},
                                    "result": result(12.5, True, {"service_lost": "jtop died", "low_coverage": REASON})}}}
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "results.json").write_text(json.dumps({"schema": DEPLOY_SCHEMA, "devices": [device]}))
    manifest = {"model": "tiny", "stages": {"evaluate": {"metrics": {"rungs": rungs}},
                                            "deploy": {"outputs": {"results": "deploy/results.json"}}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    paths = build_report(tmp_path)

    rows = {row["rung"]: row for row in csv.DictReader(open(paths["csv"]))}
    assert rows["student"]["energy_degraded"] == "True" and REASON in rows["student"]["energy_note"]
    assert "service_lost" in rows["student"]["energy_note"]
    assert rows["teacher"]["energy_degraded"] == "False" and rows["teacher"]["energy_note"] == ""
    markdown = paths["md"].read_text()
    assert "12.50 degraded [1]" in markdown and "16.00 degraded" not in markdown
    assert f"[1] energy degraded: low_coverage: {REASON}" in markdown
    html = paths["html"].read_text()
    assert "12.50 degraded [1]" in html and REASON in html

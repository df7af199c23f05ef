"""Every numeric result field is declared once (device.reported): how a rung's interleaved windows make its figure,
and the one edit that puts a new field in results.json, results.csv and the ladder's tables of both tasks.

Hand-made results in the agent's schema (validated), no model run: these check the combining rules themselves."""

import csv
import json

import pytest

from device.reported import Reported, reported, reported_fields
from device.schema import JobResult, RunResult
from pipeline.report import results
from pipeline.report.results import REPORTED, csv_columns, figure_cell, reported_figures
from tests.pipeline.test_report_fields import _write_run
from tests.results import job_result, run


def _rounds(*rounds):
    return [JobResult.model_validate(job_result(runs=runs)) for runs in rounds]


def test_a_rungs_figures_combine_its_rounds_as_each_field_declares():
    rounds = _rounds(
        [run(1, p50_ms=2.0, images_per_s=400, summary={"power_mean_mw": 5000, "energy_mj_per_image": 9.0,
                                                        "peak_memory_mb": 100}),
         run(8, p50_ms=5.0, images_per_s=1600, summary={"power_mean_mw": 8000, "energy_mj_per_image": 5.0,
                                                         "peak_memory_mb": 300})],
        [run(1, p50_ms=2.4, images_per_s=380, summary={"peak_memory_mb": 120}),
         run(8, p50_ms=5.5, images_per_s=1500, summary={"power_mean_mw": 9000, "energy_mj_per_image": 6.0,
                                                         "peak_memory_mb": 350})],
        [run(1, p50_ms=2.2, images_per_s=390),  # this round timed no batch 8: it has no throughput window
         ])
    figures = reported_figures(rounds)
    # Latency: the smallest batch's windows, one per round, their median with its interval.
    assert figures["latency_p50_windows_ms"] == [2.0, 2.4, 2.2] and figures["latency_p50_ms"] == pytest.approx(2.2)
    assert 2.0 <= figures["latency_p50_low_ms"] <= 2.2 <= figures["latency_p50_high_ms"] <= 2.4
    # Throughput and energy: the largest batch's; a round without it is None in the windows, kept for pairing.
    assert figures["throughput_windows"] == [1600, 1500, None] and figures["throughput_images_per_s"] == 1550
    assert figures["energy_windows_mj"] == [5.0, 6.0, None] and figures["energy_mj_per_image"] == pytest.approx(5.5)
    # A column in another unit: mW declared as W with its scale.
    assert figures["power_mean_w"] == pytest.approx(8.5)
    # A peak: over every window of every round, not only the first round's.
    assert figures["peak_memory_mb"] == 350
    # Nothing measured: None, never NaN or zero.
    assert figures["trt_latency_p50_ms"] is None and figures["gpu_compute_p50_low_ms"] is None
    # The ONNX road's batches chosen for another road's rounds (paired ratios need the same batch).
    assert reported_figures(rounds, latency_batch=8, throughput_batch=8)["latency_p50_windows_ms"] == [5.0, 5.5, None]


def test_every_declared_field_names_where_it_lives_and_the_csv_carries_its_interval():
    assert {"latency_p50_ms", "latency_p99_ms", "throughput_images_per_s", "energy_mj_per_image", "power_mean_w",
            "peak_memory_mb", "trt_latency_p50_ms", "gpu_compute_p50_ms", "power_peak_mw"} <= set(REPORTED)
    assert REPORTED["trt_latency_p50_ms"].path == ("device_timing", "latency_p50_ms")
    assert REPORTED["power_mean_w"].path == ("summary", "power_mean_mw")
    columns = csv_columns(("rung",))
    assert columns.index("latency_p50_low_ms") == columns.index("latency_p50_ms") + 1
    assert "energy_low_mj" in columns and "latency_p50_windows_ms" not in columns, "lists stay in results.json"
    with pytest.raises(ValueError, match="combine"):
        Reported(label="x", fmt=".1f", combine="mean")


def test_a_cell_says_not_recorded_where_the_result_is_too_old_and_shows_its_interval_when_asked():
    row = {"latency_p50_ms": 2.0, "latency_p50_low_ms": 1.9, "latency_p50_high_ms": 2.2, "not_recorded": ["gpu_temp_peak_c"]}
    assert figure_cell(row, "latency_p50_ms") == "2.000"
    assert figure_cell(row, "latency_p50_ms", with_interval=True) == "2.000 [1.900, 2.200]"
    assert figure_cell(row, "gpu_temp_peak_c") == "not recorded"
    assert figure_cell(row, "energy_mj_per_image", missing="not measured") == "not measured"


def test_one_declaration_puts_a_new_field_in_every_output(tmp_path, monkeypatch):
    """The one edit a new figure takes: its declaration (here on a throwaway subclass of the window's result). It
    reaches results.json, results.csv and the ladder detail of report.md and report.html with no other change."""

    class Declared(RunResult):
        latency_p90_ms: float = reported("the 90th percentile call", ..., label="p90 ms", fmt=".3f",
                                         combine="median", batch="latency",
                                         interval=("latency_p90_low_ms", "latency_p90_high_ms"))

    monkeypatch.setitem(results.REPORTED, "latency_p90_ms", reported_fields(Declared)["latency_p90_ms"])
    windows = [job_result(runs=[run(1, p99_ms=v)]) for v in (3.0, 3.4, 3.2)]  # the helper's p90 is its p99
    paths = _write_run(tmp_path, {"student_int8": windows})
    row = json.loads(paths["json"].read_text())["rows"][0]
    assert row["latency_p90_ms"] == pytest.approx(3.2) and row["latency_p90_low_ms"] is not None
    with open(paths["csv"]) as handle:
        assert float(next(csv.DictReader(handle))["latency_p90_ms"]) == pytest.approx(3.2)
    assert "| p90 ms |" in paths["md"].read_text() and "<td>3.200</td>" in paths["html"].read_text()


def test_the_energy_figures_flags_come_from_the_windows_its_median_is_over(tmp_path):
    """Energy is a median over the rounds: a window degraded in round 2 marks it, with in how many windows, and the
    power source is the first window's that has one (round 1 had no power reading here)."""
    quiet = {"energy_mj_per_image": 5.0, "energy_degraded": False}
    gappy = {"energy_mj_per_image": 5.4, "power_source": "jtop:VDD_IN", "energy_degraded": True,
             "energy_degraded_reasons": {"low_coverage": "fresh samples covered 61% of the window"}}
    windows = [job_result(runs=[run(1, summary=quiet)]), job_result(runs=[run(1, summary=gappy)])]
    paths = _write_run(tmp_path, {"student_int8": windows})
    row = json.loads(paths["json"].read_text())["rows"][0]
    assert row["energy_mj_per_image"] == pytest.approx(5.2) and row["power_source"] == "jtop:VDD_IN"
    assert row["energy_degraded"] is True
    assert row["energy_note"] == "energy degraded in 1 of 2 windows: low_coverage: fresh samples covered 61% of the window"

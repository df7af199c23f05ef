"""After N minutes in the report (:mod:`pipeline.tasks.classification.sustain_report`): burst against settled from a
run's intervals, the headline's line only when the settled latency is measurably worse, and ``edgefold sustain`` on a
finished run (loopback: what it cannot measure said) ending with the section, figure and fields."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from pipeline.tasks.classification.sustain_report import burst_and_settled, headline_text


def intervals(p50s, energy=None):
    return [{"end_s": 10.0 * (i + 1), "latency_p50_ms": p, "energy_mj_per_image": energy, "gpu_temp_c": 50.0 + i,
             "hottest_c": None} for i, p in enumerate(p50s)]


def test_burst_is_the_first_interval_and_settled_the_last_thirds_median():
    figures = burst_and_settled(intervals([2.0, 2.1, 2.0, 3.9, 4.0, 4.1, 3.9, 4.0, 4.2], energy=1.5))
    assert figures["burst"] == 2.0 and figures["settled"] == 4.0 and figures["settled_intervals"] == 3
    assert figures["ratio"] == 2.0 and figures["ratio_low"] <= 2.0 <= figures["ratio_high"]
    assert figures["settled_low"] >= 3.9 and figures["settled_high"] <= 4.2
    assert figures["burst_energy"] == figures["settled_energy"] == 1.5 and figures["peak_temp"] == 58.0
    one = burst_and_settled(intervals([3.0]))
    assert one["burst"] == one["settled"] == 3.0 and one["ratio"] == 1.0 and one["settled_energy"] is None


def test_the_headline_speaks_only_of_a_measurably_slower_settled_board():
    slower = {"rung": "student_int8", "device": "orin", "first_throttle_s": 390.0, "throttle_cause": "temperature",
              **burst_and_settled(intervals([2.0] * 3 + [2.6, 2.62, 2.64, 2.61, 2.62, 2.63]))}
    assert headline_text([slower]) == ("student_int8 on orin: after 6.5 min the temperature throttled it; p50 "
                                       f"settled 1.31× [{slower['ratio_low']:.2f}, {slower['ratio_high']:.2f}] above "
                                       "the first interval (2.620 vs 2.000 ms)")
    steady = {**slower, **burst_and_settled(intervals([2.0, 1.9, 2.1, 1.95, 2.05, 2.0]))}
    assert headline_text([steady]) is None


def test_edgefold_sustain_on_loopback_ends_with_after_n_minutes(tiny_run, tmp_path, capsys):
    """The tiny run again with ``edgefold sustain --minutes 0.05``: only deploy and the report run again, every
    window is reused, and the INT8 rung on loopback has its burst and settled figures, their ratio, "no throttle
    signal", and what loopback cannot measure (power, trip points, the GPU clock) said."""
    from pipeline.cli import main

    runs = tmp_path / "runs"
    shutil.copytree(tiny_run.run_dir, runs / "tiny" / "shared")
    before = json.loads((runs / "tiny" / "shared" / "manifest.json").read_text())["stages"]
    assert main(["sustain", str(runs / "tiny" / "shared"), "--minutes", "0.05", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    manifest = json.loads((runs / "tiny" / "shared" / "manifest.json").read_text())
    for stage in ("teacher", "distill", "export", "quantize", "evaluate"):
        assert manifest["stages"][stage] == before[stage], f"a sustained run re-ran {stage}"
    assert manifest["stages"]["deploy"]["metrics"]["jobs_reused"] == 10  # every ladder window
    report = runs / "tiny" / "shared" / "report"
    data = json.loads((report / "results.json").read_text())
    (run,) = data["sustained"]
    assert run["rung"] == "student_int8" and run["device"] == "loopback" and 9 <= len(run["intervals"]) <= 10
    assert run["throttle_text"] == "no throttle signal in the run" and run["first_throttle_s"] is None
    assert any(note.startswith("power: no power telemetry") for note in run["not_measured"])
    row = next(r for r in data["rows"] if r["rung"] == "student_int8")
    assert row["sustained_burst_p50_ms"] > 0 and row["sustained_minutes"] == 0.05
    assert row["sustained_settled_p50_ms_low"] <= row["sustained_settled_p50_ms"] <= row["sustained_settled_p50_ms_high"]
    with open(report / "results.csv") as handle:
        table = {r["rung"]: r for r in csv.DictReader(handle)}
    assert float(table["student_int8"]["sustained_ratio"]) == pytest.approx(row["sustained_ratio"])
    markdown = (report / "report.md").read_text()
    assert "## After 0.05 minutes" in markdown and "| student_int8 | loopback | 0.05 |" in markdown
    assert "Not measured on loopback: power: no power telemetry on this device" in markdown
    assert "sustained:loopback" in (report / "report.html").read_text() or "p50 latency, GPU clock" in markdown
    assert "report: " in out


def test_edgefold_sustain_on_the_simulated_orin_nano_finds_the_planted_throttle(tiny_run, tmp_path):
    """The done-when on a short clock: ``edgefold sustain --minutes 0.2`` on the tiny run's INT8 rung, deployed to a
    real agent on the simulated Orin Nano (the REAL jtop service; the clocked TensorRT stand-in, whose calls follow
    the GPU clock; a PLANTED heat curve whose passive trip point halves the clock 3.2 s into the run). The report's
    "After 0.2 minutes" has the throttle moment within one recording interval of the plant's, the temperature as its
    cause, the settled-over-burst ratio within 3% of the planted 2, the figure, and the headline's line."""
    import os
    import threading
    import time

    if os.geteuid() != 0:
        pytest.skip("jtop's service insists on running as root")
    pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")
    from device.client import AgentClient
    from pipeline.cli import main
    from tests.device.agent_process import AgentProcess
    from tests.device.clocked_runtime import sitecustomize_dir
    from tests.device.jetson_sim import JtopService
    from tests.device.thermal_plant import ZONES, ThermalPlant

    run = tmp_path / "runs" / "tiny" / "shared"
    shutil.copytree(tiny_run.run_dir, run)
    with JtopService(tmp_path / "board", "orin-nano") as svc:
        _, env = sitecustomize_dir(tmp_path / "site", svc.root, "10.3.0")
        plant = ThermalPlant(svc.root, start_c=50.0, steady_c=100.0, tau_s=2.0, trip_c=90.0, critical_c=120.0,
                             initial_hz=100_000_000, throttled_hz=50_000_000)
        with AgentProcess(tmp_path / "agent", env=env, args=("--jtop-socket", svc.sock, "--thermal-dir",
                                                             str(svc.root / ZONES))) as agent:
            done = threading.Event()

            def heat_with_the_run() -> None:  # the plant starts when the sustained run does
                with AgentClient(agent.url, agent.token_file.read_text().strip(), timeout_s=10) as client:
                    while not done.is_set():
                        if any("sustained: started" in (job.get("progress") or "") for job in client.jobs("running")):
                            with plant:
                                done.wait()
                            return
                        time.sleep(0.02)

            watcher = threading.Thread(target=heat_with_the_run, daemon=True)
            watcher.start()
            try:
                code = main(["sustain", str(run), "--minutes", "0.2", "--record-every-s", "1", "--edge", agent.url,
                             "--token-file", str(agent.token_file), "--set", "deploy.rungs=[teacher, student_int8]",
                             "--set", "deploy.evaluate_images=0", "--set", "deploy.duration_s=0.3",
                             "--set", "deploy.batch_sizes=[1]", "--set", "deploy.runtime=tensorrt"])
            finally:
                done.set()
                watcher.join()
    assert code == 0
    data = json.loads((run / "report" / "results.json").read_text())
    (sustained,) = [r for r in data["sustained"] if r["device"] == "edge"]
    planted = plant.started_at + plant.throttle_at_s() - sustained["started_at"]
    assert sustained["throttle_cause"] == "temperature", sustained["throttle_text"]
    assert planted <= sustained["first_throttle_s"] <= planted + 1.0 + 0.2, (planted, sustained["first_throttle_s"])
    assert sustained["ratio"] == pytest.approx(2.0, rel=0.03) and sustained["ratio_low"] > 1
    row = next(r for r in data["rows"] if r["rung"] == "student_int8" and r["device"] == "edge")
    assert row["sustained_throttle_cause"] == "temperature" and row["sustained_ratio"] == sustained["ratio"]
    markdown = (run / "report" / "report.md").read_text()
    assert "## After 0.2 minutes" in markdown and "  sustained      student_int8 on edge: after " in markdown
    assert 'alt="sustained:edge"' in (run / "report" / "report.html").read_text()

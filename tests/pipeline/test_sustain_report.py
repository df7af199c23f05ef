"""After N minutes in the report (:mod:`pipeline.deploy.sustain_report`): burst against settled from a
run's intervals, the headline's line only when the settled latency is measurably worse, and ``edgefold sustain`` on a
finished run (loopback: what it cannot measure said) ending with the section, figure and fields."""

from __future__ import annotations

import base64
import csv
import json
import shutil

import pytest

from pipeline.deploy.sustain_report import burst_and_settled, headline_text

# The simulated Orin Nano's sustained run: its two minutes are simulated ones, on a clock the job processes and the
# planted heat share (tests/device/time_scale.py), eight times the host's: 15 s here.
SIMULATED_PER_HOST_S = 8.0

def intervals(p50s, energy=None):
    return [{"end_s": 10.0 * (i + 1), "latency_p50_ms": p, "energy_mj_per_image": energy, "gpu_temp_c": 50.0 + i,
             "hottest_c": None} for i, p in enumerate(p50s)]


def test_a_bad_sustained_recipe_is_refused_with_its_key():
    from device.errors import ConfigError
    from pipeline.core.recipe import load_recipe

    for overrides, said in (
            ({"deploy.sustained.minutes": 1.0, "deploy.sustained.swept": True},
             "deploy.sustained.swept follows deploy.sweep's settings"),
            ({"deploy.sustained.minutes": 1.0, "deploy.sustained.rung": "student_fp16",
              "deploy.rungs": ["teacher", "student_int8"]}, "deploy.sustained.rung 'student_fp16' is not deployed"),
            ({"deploy.sustained.minutes": 1.0, "deploy.sustained.batch_size": 64}, "is not one of deploy.batch_sizes"),
            ({"deploy.sustained.minutes": 600.0, "deploy.sustained.swept": True, "deploy.sweep.modes": "all"},
             "× 16 setting(s) (a sweep of all modes counted as 16: name them in deploy.sweep.modes) and"),
            ({"deploy.sustained.minutes": 1.0, "deploy.sustained.cool_below_c": 5.0}, "deploy.sustained.cool_below_c")):
        with pytest.raises(ConfigError) as err:
            load_recipe("tiny", overrides)
        assert said in err.value.message, (overrides, err.value.message)


def test_a_swept_sustained_job_runs_the_sweeps_first_accelerator_within_a_timeout_for_every_setting():
    from pipeline.core.recipe import load_recipe
    from pipeline.deploy.jobs import job_spec

    cfg = load_recipe("tiny", {"deploy.sustained.minutes": 2.0, "deploy.sustained.swept": True,
                               "deploy.sustained.cool_below_c": 60.0, "deploy.sustained.cool_max_s": 30.0,
                               "deploy.sweep.modes": ["15W", "MAXN_SUPER"], "deploy.sweep.jetson_clocks": [False, True],
                               "deploy.sweep.accelerators": ["dla", "gpu"]})[0].deploy
    info = {"l4t": "36.4.0", "tensorrt": "10.3.0"}
    spec = job_spec(cfg.sustained.rung, "0" * 64, info, cfg, {"input_size": 28, "resize": 32, "channels": 1,
                                                              "mean": [0.5], "std": [0.25]}, "run/x/sustained",
                    profile=False, sustained=cfg.sustained, sweep=cfg.sweep)
    assert spec.sweep.accelerators == ["dla0"] and spec.sweep.settings() == 4
    assert spec.timeout_s == cfg.job_timeout_s + 4 * (120 + 30 + 30) + 60  # minutes, cooling, settling; the restore
    assert spec.sustained.model_dump() == {"minutes": 2.0, "batch_size": 1, "record_every_s": 10.0,
                                           "cool_below_c": 60.0, "cool_max_s": 30.0}


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


def test_a_sustained_sweep_is_one_row_per_setting_one_figure_per_device_and_its_first_setting_on_the_row(tmp_path):
    """Two real runs on loopback (ONNX Runtime), each given a swept setting as the sweep gives it, in one job result
    (2.11): the section has a setting column and each run's cooling and start temperature, one figure holds both,
    the row takes the first setting's figures and names it, and a setting the timeout skipped is said."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from device.runners import make_runner
    from device.schema import RESULT_SCHEMA, JobResult, JobSpec, NotMeasured, PowerSetting, SweepResult
    from device.jobs.sustain import run_sustained
    from pipeline.report.sections import Figure, to_markdown_lines
    from pipeline.deploy.sustain_report import join_rows, plot, section, sustained_runs
    from tests.device.agent_process import tiny_onnx
    from tests.device.test_sustain import zones

    spec = JobSpec(artifact="0" * 64, sustained={"minutes": 0.01, "record_every_s": 0.2, "cool_below_c": 60.0,
                                                 "cool_max_s": 1.0},
                   sweep={"power_modes": ["MAXN_SUPER", "15W"], "jetson_clocks": [True]})
    folder = zones(tmp_path / "thermal", {"gpu-thermal": 55.0})
    runs = []
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner:
        for mode_id, name in ((2, "MAXN_SUPER"), (0, "15W")):
            setting = PowerSetting(nvpmodel_id=mode_id, nvpmodel_name=name, jetson_clocks=True, settle_s=0.4)
            runs.append({**run_sustained(runner, spec.sustained, (3, 16, 16), [], None, thermal_dir=folder),
                         "power_setting": setting.model_dump()})
    skipped = NotMeasured(nvpmodel_id=1, nvpmodel_name="7W", jetson_clocks=True, kind="skipped",
                          reason="the job's timeout left 12 s, under the 35 s a setting needs (settling and one "
                                 "interval)")
    result = JobResult.model_validate({
        "spec": spec.model_dump(), "input_chw": [3, 16, 16], "runtime": {"name": "onnxruntime", "precision": "fp32",
                                                                         "load_s": 0.1, "python": "3.11"},
        "smoke": {"image": "smoke.png", "output_shape": [1, 10], "top1_index": 0, "preprocess": {}},
        "runs": [], "sustained": runs[0], "more_sustained": runs[1:],
        "sweep": SweepResult(controlled=True, restored=True, not_measured=[skipped])}).dump()
    assert result["schema"] == RESULT_SCHEMA and "cool_max_s" in result["spec"]["sustained"]
    shown = sustained_runs([{"name": "orin", "sustained": {"rung": "student_int8", "state": "succeeded",
                                                           "result": result}}])
    assert [run["setting"] for run in shown] == ["MAXN_SUPER, jetson_clocks on", "15W, jetson_clocks on"]
    assert all(run["start_hottest_c"] == 55.0 and run["cooling"] == "already below 60 °C (55.0 °C)" for run in shown)
    rows = [{"rung": "student_int8", "device": "orin"}]
    join_rows(shown, rows)
    assert rows[0]["sustained_setting"] == "MAXN_SUPER, jetson_clocks on"
    assert rows[0]["sustained_burst_p50_ms"] == shown[0]["burst"]
    png = plot(plt, shown)
    assert base64.b64decode(png).startswith(b"\x89PNG")
    shown_section = section(shown, {"sustained:orin": png})
    assert [block.key for block in shown_section.blocks if isinstance(block, Figure)] == ["sustained:orin"]
    text = "\n".join(to_markdown_lines(shown_section))
    assert "| rung | device | setting | minutes |" in text and "| 15W, jetson_clocks on | 0.01 |" in text
    assert "| 55.0 → " in text
    assert ("Sweep on orin: 7W, jetson_clocks on not run: the job's timeout left 12 s, under the 35 s a setting needs "
            "(settling and one interval).") in text
    assert "orin (15W, jetson_clocks on): already below 60 °C (55.0 °C)." in text


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


def test_edgefold_sustain_swept_on_loopback_says_it_could_only_run_the_mode_found(tiny_run, tmp_path):
    """``--swept`` with a sweep given by ``--set``, on loopback (no jtop service, so no power-mode control): one run
    under the mode found, and the report says why there is no other."""
    from pipeline.cli import main

    runs = tmp_path / "runs"
    shutil.copytree(tiny_run.run_dir, runs / "tiny" / "shared")
    assert main(["sustain", str(runs / "tiny" / "shared"), "--minutes", "0.02", "--swept", "--runs-dir", str(runs),
                 "--set", "deploy.sweep.modes=[15W, MAXN_SUPER]", "--set", "deploy.rungs=[teacher, student_int8]",
                 "--set", "deploy.evaluate_images=0"]) == 0
    data = json.loads((runs / "tiny" / "shared" / "report" / "results.json").read_text())
    (run,) = data["sustained"]
    assert run["setting"] is None and len(run["intervals"]) >= 2
    assert run["sweep_notes"] and run["sweep_notes"][0].startswith("no power-mode control"), run["sweep_notes"]
    markdown = (runs / "tiny" / "shared" / "report" / "report.md").read_text()
    assert "Sweep on loopback: no power-mode control" in markdown


def test_edgefold_sustain_on_the_simulated_orin_nano_finds_the_planted_throttle(tiny_run, tmp_path):
    """The done-when: ``edgefold sustain --minutes 2`` on the tiny run's INT8 rung, deployed to a real agent on the
    simulated Orin Nano (the REAL jtop service; the clocked TensorRT stand-in, whose calls follow the GPU clock, planted
    at 50 MHz; a PLANTED heat curve driven by the board's planted 6.1 W, τ 20 s, whose passive trip point halves the
    clock about 31 s into the run). The report's "After 2 minutes" has the throttle moment within one recording
    interval (the default 10 s) of the plant's, the temperature as its cause, the settled-over-burst ratio within 3%
    of the planted 2, the figure, and the headline's line. Every time here is simulated: the job and the plant share a clock
    :data:`SIMULATED_PER_HOST_S` times the host's, so the two minutes last 15 s."""
    import os

    if os.geteuid() != 0:
        pytest.skip("jtop's service insists on running as root")
    pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")
    from pipeline.cli import main
    from tests.device.agent_process import AgentProcess
    from tests.device.clocked_runtime import sitecustomize_dir
    from tests.device.jetson_sim import JtopService
    from tests.device.thermal_plant import ZONES, ThermalPlant, heating_with_the_run
    from tests.device.time_scale import TimeScale

    run = tmp_path / "runs" / "tiny" / "shared"
    shutil.copytree(tiny_run.run_dir, run)
    clock = TimeScale.starting_now(SIMULATED_PER_HOST_S)
    with JtopService(tmp_path / "board", "orin-nano") as svc:
        _, env = sitecustomize_dir(tmp_path / "site", svc.root, "10.3.0", clock=clock)
        plant = ThermalPlant(svc.root, start_c=50.0, tau_s=20.0, ambient_c=40.0, c_per_w=10.0, trip_c=90.0,
                             critical_c=120.0, initial_hz=50_000_000, throttled_hz=25_000_000, clock=clock)
        with AgentProcess(tmp_path / "agent", env=env, args=("--jtop-socket", svc.sock, "--thermal-dir",
                                                             str(svc.root / ZONES))) as agent:
            with heating_with_the_run(agent, plant):  # the plant starts when the sustained run does
                code = main(["sustain", str(run), "--minutes", "2", "--edge", agent.url,
                             "--token-file", str(agent.token_file), "--set", "deploy.rungs=[teacher, student_int8]",
                             "--set", "deploy.evaluate_images=0", "--set", "deploy.duration_s=0.3",
                             "--set", "deploy.batch_sizes=[1]", "--set", "deploy.runtime=tensorrt",
                                 "--set", "deploy.nvinfer=false"])  # the sustained run is this test's; no forms
    assert code == 0
    data = json.loads((run / "report" / "results.json").read_text())
    (sustained,) = [r for r in data["sustained"] if r["device"] == "edge"]
    planted = plant.first("throttled") - sustained["started_at"]  # on the job's clock
    assert 25 < planted < 40, "the planted curve crosses 90 °C about 31 s in"
    assert sustained["throttle_cause"] == "temperature", sustained["throttle_text"]
    assert planted <= sustained["first_throttle_s"] <= planted + 10.0 + 0.5, (planted, sustained["first_throttle_s"])
    # Bands for a loaded two-core host: the simulated clock runs faster than the host's, so a worker starved by the
    # others stretches an interval's samples (seen: ratio 1.924, a power interval beyond 5%, both with 3 workers).
    assert sustained["ratio"] == pytest.approx(2.0, rel=0.06) and sustained["ratio_low"] > 1
    assert len(sustained["intervals"]) == 12 and sustained["intervals"][-1]["end_s"] == pytest.approx(120, abs=1)
    assert sustained["stopped_early"] is None, "the job's timeout comes from the agent's clock, the host's"
    # What jtop measured lands in the right intervals on the job's clock: the planted 15W mode's input power in
    # every one, the GPU clock jtop read at 50 MHz before the trip point and at 25 MHz after it.
    first, last = sustained["intervals"][0], sustained["intervals"][-1]
    assert all(i["power_mw"] == pytest.approx(6100, rel=0.1) for i in sustained["intervals"]), \
        sustained["intervals"]
    assert first["gpu_clock_median_mhz"] == pytest.approx(50) and last["gpu_clock_median_mhz"] == pytest.approx(25)
    row = next(r for r in data["rows"] if r["rung"] == "student_int8" and r["device"] == "edge")
    assert row["sustained_throttle_cause"] == "temperature" and row["sustained_ratio"] == sustained["ratio"]
    markdown = (run / "report" / "report.md").read_text()
    assert "## After 2 minutes" in markdown and "| sustained | student_int8 on edge: after " in markdown
    assert 'alt="sustained:edge"' in (run / "report" / "report.html").read_text()

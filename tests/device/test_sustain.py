"""After ten minutes (:mod:`device.jobs.sustain`): the engine run without pause, recorded interval by interval. On loopback
with real ONNX Runtime (what it cannot measure said), the kernel's trip points read and a zone near its critical one
stopping the run, the agent refusing a bad spec or a run past its timeout with 422, and a cancel ending the load at
once; on the simulated Orin Nano (the REAL jtop service, the clocked TensorRT stand-in, a PLANTED heat curve), the
throttle moment and the settled-over-burst ratio the plant set."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from device.errors import ConfigError
from device.power.jtop_client import use_socket
from device.runners import make_runner
from device.jobs.sustain import (NoIntervalError, SustainedTime, first_throttle, run_sustained, thermal_zones,
                                 trip_points)
from device.jobs.sustain_schema import SustainedResult, SustainedSpec
from tests.device.agent_process import TOKEN, AgentProcess, tiny_onnx
from tests.slow import slow_fixture

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def zones(root: Path, temps: dict[str, float], trips: dict[str, list[tuple[str, float]]] | None = None) -> Path:
    """A thermal folder as the kernel lays it out: ``thermal_zoneN/{type,temp,trip_point_M_type,trip_point_M_temp}``."""
    for index, (zone, temp) in enumerate(temps.items()):
        folder = root / f"thermal_zone{index}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "type").write_text(zone + "\n")
        (folder / "temp").write_text(f"{int(temp * 1000)}\n")
        for number, (kind, limit) in enumerate((trips or {}).get(zone, [])):
            (folder / f"trip_point_{number}_type").write_text(kind + "\n")
            (folder / f"trip_point_{number}_temp").write_text(f"{int(limit * 1000)}\n")
    return root


def test_trip_points_are_read_as_the_kernel_lists_them(tmp_path):
    folder = zones(tmp_path, {"cpu-thermal": 48.25, "gpu-thermal": 46.5},
                   {"gpu-thermal": [("passive", 99.0), ("critical", 104.5)]})
    (folder / "thermal_zone0" / "trip_point_0_type").write_text("passive\n")  # a trip without its temperature
    (folder / "thermal_zone0" / "trip_point_1_type").write_text("passive\n")  # a driver's unused placeholder
    (folder / "thermal_zone0" / "trip_point_1_temp").write_text("-274000\n")
    assert trip_points(thermal_zones(folder)) == [{"zone": "gpu-thermal", "type": "passive", "temp_c": 99.0},
                                                  {"zone": "gpu-thermal", "type": "critical", "temp_c": 104.5}]


def test_nvml_reasons_are_the_bits_seen_in_the_interval_each_named():
    """Two samples, a power cap (0x4) then a thermal slowdown (0x20): both are signals, not the larger one alone;
    the GPU clock's reference is the first interval's peak, so a board ramping up in it is no drop later."""
    from device.jobs.sustain import _interval
    from device.telemetry.base import Trace
    from device.telemetry import series

    trace = Trace(np.array([0.0, 0.5, 1.0, 1.5]), {series.THROTTLE_REASONS: np.array([0.0, 4.0, 32.0, 0.0]),
                                                   series.GPU_FREQ: np.array([900.0, 1400.0, 1350.0, 1380.0])}, 20.0)
    sampler = type("Nvml", (), {"name": "nvml"})()
    raw = {"start": 0.2, "stop": 1.2, "end_s": 1.0, "latencies": [0.01] * 10, "temps": {}}
    record = _interval(raw, 1, [trace], [sampler], None, [], first_clock=1400.0)
    assert record["signals"] == ["power: NVML clock-event reasons 0x24 (a power cap)",
                                 "temperature: NVML clock-event reasons 0x24 (a thermal or hardware slowdown)"]
    assert record["gpu_clock_mhz"] == 1350.0  # its lowest: within 95% of the first interval's peak, no clock signal


def test_a_governors_dip_is_no_throttle_and_a_held_drop_is():
    """Without jetson_clocks the GPU runs under DVFS and jtop reads the instantaneous clock (jetson-stats 7.2.2,
    core/gpu.py): one sample of a governor's dip to 306 MHz is no throttle; the clock held at 624 MHz is."""
    from device.jobs.sustain import _interval
    from device.telemetry import series
    from device.telemetry.base import Trace

    sampler = type("Jtop", (), {"name": "jtop"})()
    raw = {"start": 0.0, "stop": 2.0, "end_s": 2.0, "latencies": [0.01] * 10, "temps": {}}
    times = np.arange(0.0, 2.0, 0.25)
    dip = Trace(times, {series.GPU_FREQ: np.array([1300.0, 1300, 306, 1300, 1300, 1300, 1300, 1300])}, 4.0)
    record = _interval(raw, 1, [dip], [sampler], None, [], first_clock=1300.0)
    assert record["signals"] == [] and record["gpu_clock_mhz"] == 306.0 and record["gpu_clock_median_mhz"] == 1300.0
    held = Trace(times, {series.GPU_FREQ: np.array([1300.0, 624, 624, 624, 624, 624, 624, 1300])}, 4.0)
    record = _interval(raw, 1, [held], [sampler], None, [], first_clock=1300.0)
    assert record["signals"] == ["clock: the GPU at 624 MHz (the interval's median), 1300 in the first interval"]


def test_the_first_throttle_names_a_temperature_before_a_power_cap_before_a_clock_drop():
    quiet = {"end_s": 1.0, "signals": []}
    both = {"end_s": 2.0, "signals": ["clock: the GPU at 306 MHz, 624 in the first interval",
                                      "temperature: gpu-thermal at 99.2 °C, past its passive trip point 99.0 °C"]}
    power = {"end_s": 3.0, "signals": ["power: NVML clock-event reasons 0x4"]}
    assert first_throttle([quiet, both, power])["throttle_cause"] == "temperature"
    assert first_throttle([quiet, power, both]) == {"first_throttle_s": 3.0, "throttle_cause": "power",
                                                    "throttle_text": "after 0.1 min: power: NVML clock-event reasons "
                                                                     "0x4"}
    assert first_throttle([quiet]) == {"first_throttle_s": None, "throttle_cause": "none",
                                       "throttle_text": "no throttle signal in the run"}


def test_a_run_on_loopback_records_every_interval_and_says_what_it_could_not_measure(tmp_path):
    folder = zones(tmp_path / "thermal", {"x86_pkg_temp": 41.0})
    spec = SustainedSpec(minutes=0.02, batch_size=2, record_every_s=0.4)
    progress = []
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner:
        result = run_sustained(runner, spec, (3, 16, 16), [], None, thermal_dir=folder, progress=progress.append)
    SustainedResult.model_validate(result)
    # A spec without cooling is written with 2.10's keys only, in the job's result too: a 2.10 reader (its sustained
    # spec strict, refusing keys it does not know) reads it.
    from device.schema import JobResult

    document = JobResult.model_validate({
        "spec": {"artifact": "0" * 64, "batch_sizes": [2], "sustained": spec.model_dump()}, "input_chw": [3, 16, 16],
        "runtime": {"name": "onnxruntime", "precision": "fp32", "load_s": 0.1, "python": "3.11"},
        "smoke": {"image": "smoke.png", "output_shape": [2, 10], "top1_index": 0, "preprocess": {}}, "runs": [],
        "sustained": result}).dump()
    assert set(document["sustained"]["spec"]) == set(document["spec"]["sustained"]) == {"minutes", "batch_size",
                                                                                         "record_every_s"}
    intervals = result["intervals"]
    # three intervals on a 0.4 s grid; a host stalled past a grid line may fold a short tail into the one before
    assert len(intervals) in (2, 3) and intervals[-1]["end_s"] == pytest.approx(1.2, abs=0.3)
    for interval in intervals:
        assert interval["calls"] > 0 and interval["images"] == 2 * interval["calls"]
        assert 0 < interval["latency_p50_ms"] <= interval["latency_p90_ms"] <= interval["latency_p99_ms"]
        assert interval["latency_p50_low_ms"] <= interval["latency_p50_ms"] <= interval["latency_p50_high_ms"]
        assert interval["hottest_c"] == 41.0 and interval["power_mw"] is None and interval["signals"] == []
    assert result["not_measured"] == [
        "power: no power telemetry on this device (jtop or NVML)",
        f"trip points: the thermal zones under {folder} list none", "GPU clock: no sampler reads it here (jtop or NVML)"]
    assert result["throttle_cause"] == "none" and result["stopped_early"] is None
    assert progress[0] == "sustained: started, 0.02 min at batch 2"
    assert progress[1].startswith("sustained: 0.0/0.02 min, p50 ") and progress[1].endswith("hottest zone 41.0 °C")


def test_a_zone_near_its_critical_trip_point_stops_the_run_and_says_so(tmp_path):
    folder = zones(tmp_path / "thermal", {"gpu-thermal": 101.0}, {"gpu-thermal": [("passive", 95.0),
                                                                                  ("critical", 105.0)]})
    spec = SustainedSpec(minutes=1.0, record_every_s=0.3)
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner:
        started = time.monotonic()
        result = run_sustained(runner, spec, (3, 16, 16), [], None, thermal_dir=folder, margin_c=5.0)
    assert time.monotonic() - started < 30 and len(result["intervals"]) == 1
    assert result["stopped_early"] == ("stopped after 0.0 min: gpu-thermal at 101.0 °C, within 5 °C of its critical "
                                       "trip point 105.0 °C")
    assert result["throttle_cause"] == "temperature" and "past its passive trip point 95.0 °C" in \
        result["throttle_text"]


@pytest.fixture(scope="module")
@slow_fixture
def agent(tmp_path_factory):
    with AgentProcess(tmp_path_factory.mktemp("agent"), args=("--job-timeout-s", "300")) as process:
        yield process


def test_a_bad_sustained_spec_or_a_run_past_the_timeout_is_a_422_with_the_reason(agent, tmp_path):
    with agent.client() as client:
        sha = client.upload(tiny_onnx(tmp_path / "tiny.onnx"))
    for sustained, extra, said in (
            ({"minutes": 0}, {}, "greater than 0"), ({"minutes": -1.0}, {}, "greater than 0"),
            ({"minutes": 0.5, "record_every_s": 60}, {}, "record_every_s 60 s is longer than the run"),
            ({"minutes": 1.0, "batch_size": 4}, {}, "sustained.batch_size 4 is not one of batch_sizes [1]"),
            ({"minutes": 1.5}, {"timeout_s": 120.0}, "(90 s, and 90 s to load, build and write the result) is past timeout_s 120 s"),
            ({"minutes": 4.5}, {}, "past the job's effective timeout 300 s (the agent's job_timeout_s)"),
            ({"minutes": 2.5}, {"sweep": {"power_modes": ["15W", "MAXN_SUPER"]}},
             "sustained.minutes 2.5 (2 settings × (150 s and up to 30 s to settle), 60 s to restore the mode, and 90 s "
             "to load, build and write the result) is past the job's effective timeout 300 s"),
            ({"minutes": 0.5, "cool_below_c": 60.0}, {"sweep": {"power_modes": ["15W"], "jetson_clocks": [False, True]}},
             "(2 settings × (30 s and up to 300 s of cooling and up to 30 s to settle), 60 s to restore the mode, and "
             "90 s to load, build and write the result)"),
            ({"minutes": 0.5}, {"runtime": "tensorrt", "sweep": {"power_modes": ["15W"], "accelerators": ["gpu", "dla0"]}},
             "a sustained sweep runs one accelerator"),
            ({"minutes": 0.5, "cool_max_s": 0.5}, {}, "cool_max_s")):
        response = httpx.post(f"{agent.url}/v1/jobs", json={"artifact": sha, "sustained": sustained, **extra},
                              headers=AUTH)
        assert response.status_code == 422 and said in response.text, (sustained, response.text)


def test_a_cancel_mid_run_leaves_the_agent_idle_within_a_second(agent, tmp_path):
    """The job's process (the only process the job added under the agent) is gone within a second of the cancel,
    and the agent answers that nothing runs."""
    import psutil

    def processes() -> set[int]:
        return {child.pid for child in psutil.Process(agent.process.pid).children(recursive=True)}

    with agent.client() as client:
        sha = client.upload(tiny_onnx(tmp_path / "tiny.onnx"))
        idle = processes()
        job = client.submit({"artifact": sha, "telemetry": ["host"], "sustained": {"minutes": 0.9,
                                                                                   "record_every_s": 0.5}})
        deadline = time.monotonic() + 60
        while "sustained:" not in (client.job(job["id"])["progress"] or ""):
            assert time.monotonic() < deadline, client.job(job["id"])
            time.sleep(0.05)
        running = processes() - idle
        assert running, "the job runs in a process of its own"
        started = time.monotonic()
        assert client.cancel(job["id"])["state"] == "cancelled"
        while running & processes() or client.health()["running"]:
            assert time.monotonic() - started < 1.0, "the cancelled load still runs"
            time.sleep(0.02)


# -------------------------------------------------------------- the simulated Orin Nano with a planted heat curve
needs_jtop = pytest.mark.skipif(os.geteuid() != 0, reason="jtop's service insists on running as root")


# The simulated board's runs below are on a clock the job processes and the plant share (tests/device/time_scale.py),
# this many times the host's: every time they state (minutes, τ, the throttle moment) is simulated.
SIMULATED_PER_HOST_S = 3.0


def sustained_on_orin_nano(tmp_path, plant_kwargs: dict, minutes: float = 0.2, record_every_s: float = 1.0,
                           scale: float = SIMULATED_PER_HOST_S, **job) -> tuple[dict, object]:
    """A sustained job through a real agent on the simulated Orin Nano while the plant heats its GPU zone; ``job``:
    more of the job (a sweep, the sustained spec's other keys under ``sustained_extra``); ``scale``: simulated
    seconds per host second. The result, with the mode the board was in before and after (``mode_before``,
    ``mode_after``)."""
    pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")
    from tests.device.clocked_runtime import sitecustomize_dir
    from tests.device.jetson_sim import JtopService, mode_state
    from tests.device.thermal_plant import ZONES, ThermalPlant, heating_with_the_run
    from tests.device.time_scale import TimeScale

    extra = job.pop("sustained_extra", {})
    clock = TimeScale.starting_now(scale)
    with JtopService(tmp_path, "orin-nano") as svc:
        _, env = sitecustomize_dir(tmp_path / "site", svc.root, "10.3.0", clock=clock)
        args = ("--jtop-socket", svc.sock, "--thermal-dir", str(svc.root / ZONES),
                "--nvpmodel-conf", str(svc.root / "etc/nvpmodel.conf"))
        plant = ThermalPlant(svc.root, **plant_kwargs, clock=clock)
        before = mode_state(svc.root)
        with AgentProcess(tmp_path / "data", env=env, args=args) as agent, agent.client() as client:
            job = client.submit({"artifact": client.upload(tiny_onnx(tmp_path / "tiny.onnx")), "runtime": "tensorrt",
                                 "telemetry": ["jtop", "host"], "sample_hz": 20, **job,
                                 "sustained": {"minutes": minutes, "record_every_s": record_every_s, **extra}})
            with heating_with_the_run(agent, plant):  # the heat starts with the run
                job = client.wait(job["id"], timeout_s=180)
        after = mode_state(svc.root)
    assert job["state"] == "succeeded", job["error"]
    return {**job["result"], "mode_before": before, "mode_after": after}, plant


@needs_jtop
@pytest.mark.slow
def test_the_planted_throttle_moment_and_settled_ratio_are_found(tmp_path):
    """The GPU zone heats from 50 °C toward 101 °C (40 °C ambient + 10 °C/W × the planted 6.1 W; τ 2 s) past its
    90 °C trip point (about 3.1 s from the plant's start, when the run starts); the clock then halves, 100 → 50 MHz,
    so each call takes twice as long (39 → 78 ms planted). The job finds the moment within one recording interval,
    names the temperature as the cause, and settles at twice the burst latency within 3%."""
    from pipeline.deploy.sustain_report import burst_and_settled

    result, plant = sustained_on_orin_nano(tmp_path, {"start_c": 50.0, "ambient_c": 40.0, "c_per_w": 10.0,
                                                      "tau_s": 2.0, "trip_c": 90.0, "critical_c": 120.0,
                                                      "initial_hz": 100_000_000, "throttled_hz": 50_000_000})
    sustained = result["sustained"]
    planted = plant.first("throttled") - sustained["started_at"]  # on the job's clock
    assert plant.first("throttled") - plant.started_at == pytest.approx(plant.throttle_at_s(), abs=0.2), \
        "the plant's own moment, at the planted 6.1 W"
    assert sustained["throttle_cause"] == "temperature", sustained["throttle_text"]
    assert planted <= sustained["first_throttle_s"] <= planted + 1.0 + 0.2, (planted, sustained["first_throttle_s"])
    figures = burst_and_settled(sustained["intervals"])
    assert figures["ratio"] == pytest.approx(2.0, rel=0.03), figures
    assert sustained["intervals"][0]["gpu_clock_mhz"] == pytest.approx(100, rel=0.01)
    assert sustained["intervals"][-1]["gpu_clock_mhz"] == pytest.approx(50, rel=0.01)
    assert sustained["intervals"][0]["power_mw"] == pytest.approx(6096, rel=0.01)


@needs_jtop
@pytest.mark.slow
def test_a_board_that_never_heats_reports_no_throttle(tmp_path):
    result, _ = sustained_on_orin_nano(tmp_path, {"start_c": 45.0, "ambient_c": 30.0, "c_per_w": 4.0, "tau_s": 2.0,
                                                  "trip_c": 90.0, "throttled_hz": 312375000}, minutes=0.1)
    sustained = result["sustained"]
    assert sustained["throttle_cause"] == "none" and sustained["first_throttle_s"] is None
    assert all(interval["signals"] == [] for interval in sustained["intervals"])
    assert [t["type"] for t in sustained["trip_points"] if t["zone"] == "gpu-thermal"] == ["passive", "critical"]


@needs_jtop
@pytest.mark.slow
def test_a_dvfs_governors_dips_on_the_simulated_board_are_no_throttle(tmp_path):
    """Planted: without jetson_clocks the GPU's governor drops the clock from 100 to 40 MHz for 0.15 s of every
    0.7 s, on a board that never heats. jtop reads the instantaneous clock, so some of every interval's samples
    dip; an interval's lowest sample against the first interval's peak read each dip as a clock throttle."""
    result, plant = sustained_on_orin_nano(tmp_path, {"start_c": 45.0, "ambient_c": 30.0, "c_per_w": 4.0,
                                                      "tau_s": 2.0, "trip_c": 90.0, "throttled_hz": 50_000_000,
                                                      "initial_hz": 100_000_000, "dip_hz": 40_000_000,
                                                      "dip_every_s": 0.7},
                                           minutes=0.1)
    sustained = result["sustained"]
    assert plant.dips >= 4, "the governor dipped during the run"
    assert any(interval["gpu_clock_mhz"] == pytest.approx(40, rel=0.05) for interval in sustained["intervals"]
               if interval.get("gpu_clock_mhz") is not None), "jtop saw the dips"
    assert sustained["throttle_cause"] == "none" and sustained["first_throttle_s"] is None, sustained["throttle_text"]
    assert all(interval["signals"] == [] for interval in sustained["intervals"]), sustained["intervals"]


@needs_jtop
@pytest.mark.slow
def test_a_sustained_sweep_runs_each_mode_under_its_own_heat_and_restores_the_mode(tmp_path):
    """MAXN_SUPER then 15W, from 15W: the plant settles at 30 °C + 8 °C/W × the mode's planted watts, so MAXN_SUPER
    (12.2 W, 127.5 °C) crosses the 90 °C trip point about 1.5 s in and halves the clock, 100 → 50 MHz; 15W (6.1 W,
    78.8 °C) never reaches it. The 15W run waits until the zone is below 85 °C (cooling from MAXN_SUPER's heat, and
    the clock given back 3 °C under the trip point), so it starts unthrottled. One result per mode, each with its
    setting, power and throttle; the board back in 15W with the hold gone."""
    from pipeline.deploy.sustain_report import burst_and_settled

    result, plant = sustained_on_orin_nano(
        tmp_path, {"start_c": 50.0, "ambient_c": 30.0, "c_per_w": 8.0, "tau_s": 2.0, "trip_c": 90.0,
                   "critical_c": 140.0, "initial_hz": 100_000_000, "throttled_hz": 50_000_000},
        minutes=0.15, sweep={"power_modes": ["MAXN_SUPER", "15W"], "settle_timeout_s": 20},
        sustained_extra={"cool_below_c": 85.0, "cool_max_s": 30.0})
    maxn, low = result["sustained"], result["more_sustained"][0]
    assert len(result["more_sustained"]) == 1 and result["runs"] == []
    assert (maxn["power_setting"]["nvpmodel_name"], low["power_setting"]["nvpmodel_name"]) == ("MAXN_SUPER", "15W")
    assert maxn["intervals"][0]["power_mw"] == pytest.approx(12192, rel=0.01)
    assert low["intervals"][0]["power_mw"] == pytest.approx(6096, rel=0.01)
    assert maxn["throttle_cause"] == "temperature"
    planted = plant.first("throttled") - maxn["started_at"]
    assert planted <= maxn["first_throttle_s"] <= planted + 1.0 + 0.2, (planted, maxn["first_throttle_s"])
    assert burst_and_settled(maxn["intervals"])["ratio"] == pytest.approx(2.0, rel=0.03)
    assert low["cooling"].startswith("cooled from ") and low["start_hottest_c"] < 85.0, low["cooling"]
    assert low["throttle_cause"] == "none" and burst_and_settled(low["intervals"])["ratio"] == pytest.approx(1, rel=0.03)
    sweep = result["sweep"]
    assert sweep["restored"] is True and sweep["original"]["nvpmodel_name"] == "15W"
    assert result["mode_after"] == result["mode_before"]


def test_a_run_the_jobs_timeout_would_cut_keeps_its_intervals_and_says_so(tmp_path):
    """``stop_by`` (the job's timeout less what its result needs) 1.2 s into a 1-minute run: the run ends there with
    its intervals, and says why."""
    spec = SustainedSpec(minutes=1.0, record_every_s=0.4)
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner:
        started = time.monotonic()
        result = run_sustained(runner, spec, (3, 16, 16), [], None, thermal_dir=tmp_path / "none",
                               stop_by=time.monotonic() + 1.2)
    assert time.monotonic() - started < 20 and 1 <= len(result["intervals"]) <= 4
    assert re.fullmatch(r"stopped after [0-9] s of 60 s: the job's timeout was near; the intervals so far are kept",
                        result["stopped_early"]), result["stopped_early"]
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner, \
            pytest.raises(NoIntervalError, match="no time to record an interval: the job's timeout was 0.0 s away"):
        run_sustained(runner, spec, (3, 16, 16), [], None, thermal_dir=tmp_path / "none", stop_by=time.monotonic())


def test_the_time_left_skips_a_setting_it_cannot_fit_and_refuses_too_many_settings():
    """:class:`SustainedTime`: the time left under a setting's settling and one interval skips it, saying why, and a
    count of settings past the timeout is refused before anything changes."""
    spec = SustainedSpec(minutes=1.0, record_every_s=5.0)
    time_left = SustainedTime(spec, settle_s=30.0, timeout_s=330.0, stop_by=time.monotonic() + 100)
    assert time_left.late() is None and not time_left.ran_out
    time_left.stop_by = time.monotonic() + 20
    assert re.fullmatch(r"the job's timeout left (19|20) s, under the 35 s a setting needs \(settling and one "
                        r"interval\)", time_left.late())
    assert time_left.ran_out
    time_left.check(2)  # 2 × (60 + 30) + 60 + 90 = 330
    with pytest.raises(ConfigError, match=r"3 settings × \(60 s and up to 30 s to settle\), 60 s to restore the "
                                          r"mode, and 90 s to load, build and write the result\) is past the job's "
                                          r"timeout 330 s"):
        time_left.check(3)


def test_cooling_waits_for_the_zones_and_says_what_it_did(tmp_path):
    """A zone at 70 °C written down to 50 °C by a thread after 1 s: the run waits for 60 °C, then starts; a zone that
    never cools is waited for cool_max_s and the run starts hotter, said."""
    import threading

    folder = zones(tmp_path / "thermal", {"gpu-thermal": 70.0})
    cooler = threading.Timer(1.0, lambda: (folder / "thermal_zone0" / "temp").write_text("50000\n"))
    cooler.start()
    spec = SustainedSpec(minutes=0.01, record_every_s=0.3, cool_below_c=60.0, cool_max_s=20.0)
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner:
        cooled = run_sustained(runner, spec, (3, 16, 16), [], None, thermal_dir=folder)
        (folder / "thermal_zone0" / "temp").write_text("70000\n")
        hot = run_sustained(runner, spec.model_copy(update={"cool_max_s": 1.0}), (3, 16, 16), [], None,
                            thermal_dir=folder)
    cooler.join()
    assert cooled["cooling"].startswith("cooled from 70.0 to 50.0 °C in ") and cooled["start_hottest_c"] == 50.0
    assert re.fullmatch(r"still 70.0 °C after [12] s \(cool_below_c 60 °C\): started hotter", hot["cooling"])
    assert hot["start_hottest_c"] == 70.0
    SustainedResult.model_validate(hot)


@needs_jtop
@pytest.mark.slow
def test_a_cancel_mid_sustained_sweep_leaves_the_agent_idle_and_the_mode_restored(tmp_path):
    """Cancelled in MAXN_SUPER's run (from 15W): the agent answers that nothing runs within a second, and its restore
    from the hold puts 15W back."""
    pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")
    from tests.device.jetson_sim import JtopService, mode_state

    with JtopService(tmp_path, "orin-nano") as svc, AgentProcess(
            tmp_path / "data", args=("--jtop-socket", svc.sock, "--nvpmodel-conf",
                                     str(svc.root / "etc/nvpmodel.conf"))) as agent, agent.client() as client:
        before = mode_state(svc.root)
        job = client.submit({"artifact": client.upload(tiny_onnx(tmp_path / "tiny.onnx")), "telemetry": ["host"],
                             "sweep": {"power_modes": ["MAXN_SUPER", "15W"], "settle_timeout_s": 20},
                             "sustained": {"minutes": 1.0, "record_every_s": 1.0}})
        deadline = time.monotonic() + 120
        while "MAXN_SUPER" not in (progress := client.job(job["id"])["progress"] or "") or "sustained:" not in progress:
            assert time.monotonic() < deadline, client.job(job["id"])
            time.sleep(0.05)
        assert mode_state(svc.root)["id"] == 2
        started = time.monotonic()
        assert client.cancel(job["id"])["state"] == "cancelled"
        while client.health()["running"]:
            assert time.monotonic() - started < 1.0, "the cancelled load still runs"
            time.sleep(0.02)
        while (tmp_path / "data" / "power_mode_hold.json").exists():
            assert time.monotonic() - started < 60, "the agent's restore after the cancel"
            time.sleep(0.1)
        assert mode_state(svc.root) == before


@needs_jtop
@pytest.mark.slow
def test_a_setting_the_timeout_leaves_no_time_for_is_never_set(tmp_path, monkeypatch):
    """run_sweep through the REAL jtop service on the simulated Orin Nano, asking a sustained job's time before each
    setting: MAXN_SUPER is set and run; 15W, after the time ran out, is never set (no call to set it) and is
    recorded as skipped with the reason; the mode found is restored."""
    pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")
    import jtop.service

    from device.power.power_modes import ModeController
    from device.schema import SweepSpec
    from device.jobs.sweep import run_sweep
    from tests.device.jetson_sim import JtopService, mode_state

    class OneSettingOfTime:
        def __init__(self):
            self.asked, self.counted = 0, None

        def check(self, settings: int) -> None:
            self.counted = settings

        def late(self) -> str | None:
            self.asked += 1
            return None if self.asked == 1 else "the job's timeout left 3 s, under the 21 s a setting needs"

    set_calls, real_set = [], ModeController.set
    monkeypatch.setattr(ModeController, "set", lambda self, mode, *rest: (set_calls.append(mode.name),
                                                                          real_set(self, mode, *rest))[1])
    monkeypatch.setattr(jtop.service, "JTOP_PIPE", jtop.service.JTOP_PIPE)  # use_socket's global, put back after
    budget = OneSettingOfTime()
    with JtopService(tmp_path, "orin-nano") as svc:
        before = mode_state(svc.root)
        use_socket(svc.sock)
        runs, sweep = run_sweep(SweepSpec(power_modes=["MAXN_SUPER", "15W"], settle_timeout_s=20),
                                "0123456789ab", tmp_path / "hold.json", str(svc.root / "etc/nvpmodel.conf"), 0.5,
                                lambda setting, where: [(setting.nvpmodel_name, mode_state(svc.root)["id"])],
                                lambda text: None, budget=budget)
        after = mode_state(svc.root)
    assert budget.counted == 2 and set_calls == ["MAXN_SUPER"] and runs == [("MAXN_SUPER", 2)]
    assert [(item.nvpmodel_name, item.kind, item.reason) for item in sweep.not_measured] == [
        ("15W", "skipped", "the job's timeout left 3 s, under the 21 s a setting needs")]
    assert sweep.restored is True and after == before and not (tmp_path / "hold.json").exists()


def test_an_intervals_median_clock_is_a_reading_the_gpu_had():
    """Two readings in an interval, one in a governor's dip (a loaded host's jtop delivered that few): the median is
    the upper reading, not 70 MHz, a clock the GPU never ran at, which read as a throttle."""
    import numpy as np

    from device.jobs.sustain import _over

    class Trace:
        times_s = np.array([0.2, 0.6])
        values = {"gpu_freq_mhz": np.array([40.0, 100.0])}

    assert _over([Trace()], "gpu_freq_mhz", 0.0, 1.0, "median") == 100.0
    Trace.times_s, Trace.values = np.array([0.1, 0.4, 0.8]), {"gpu_freq_mhz": np.array([50.0, 50.0, 100.0])}
    assert _over([Trace()], "gpu_freq_mhz", 0.0, 1.0, "median") == 50.0, "a throttle held over most readings shows"

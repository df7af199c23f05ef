"""Power modes without a service: the nvpmodel configuration parser, the settle check, the hold file and
the sweep's job spec (the jtop path itself is tested in test_sweep.py, on the simulated Jetson)."""

import json

import pytest
from pydantic import ValidationError

from device.errors import ConfigError
from device.power.power_modes import (HOLD_SCHEMA, DeviceState, Observed, PowerMode, PowerModeError, parse_nvpmodel_conf,
                                read_hold, write_hold)
from device.schema import JobSpec
from device.jobs.sweep import resolve_modes
from tests.device.jetson_sim import ORIN_NANO_MODES, nvpmodel_conf

ARTIFACT = "a" * 64


def test_the_simulated_boards_conf_parses_to_its_mode_table():
    modes = parse_nvpmodel_conf(nvpmodel_conf(ORIN_NANO_MODES))
    assert sorted(modes) == [0, 1, 2]
    seven = modes[1]
    assert seven.name == "7W" and seven.gpu_max_hz == 420750000
    assert seven.online == {0: True, 1: True, 2: True, 3: True, 4: False, 5: False}
    # One cap per cluster, on the core its PARAM section's path names (cpu0: cores 0-3, cpu4: cores 4-5).
    assert seven.cpu_max_khz == {0: 1113600, 4: 1113600}
    assert modes[2].name == "MAXN_SUPER" and modes[2].gpu_max_hz == 1020000000


def test_uncapped_values_and_comments_are_not_caps():
    text = """# a board's file
< PARAM TYPE=CLOCK NAME=GPU >
MAX_FREQ /sys/devices/gpu.0/devfreq/17000000.ga10b/max_freq
< PARAM TYPE=CLOCK NAME=CPU_A78_0 >
MAX_FREQ /sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq
< POWER_MODEL ID=0 NAME=MAXN >
GPU MAX_FREQ -1
CPU_A78_0 MAX_FREQ 2147483647
< POWER_MODEL ID=1 NAME=15W >
GPU MAX_FREQ 612000000  # a cap
CPU_A78_0 MAX_FREQ 1113600
"""
    modes = parse_nvpmodel_conf(text)
    assert modes[0].gpu_max_hz is None and modes[0].cpu_max_khz == {}
    assert modes[1].gpu_max_hz == 612000000 and modes[1].cpu_max_khz == {0: 1113600}
    with pytest.raises(PowerModeError, match="no POWER_MODEL"):
        parse_nvpmodel_conf("< PARAM TYPE=FILE NAME=CPU_ONLINE >\n")


def test_settle_check_names_what_differs_and_accepts_an_operating_point_rounding():
    caps = parse_nvpmodel_conf(nvpmodel_conf(ORIN_NANO_MODES))[2]
    settled = Observed(online={i: True for i in range(6)}, cpu_max_khz={i: 1728000 for i in range(6)},
                       gpu_max_khz=1020000, jetson_clocks=False, nvpmodel_id=2)
    assert settled.mismatches(caps, None) == []
    rounded = Observed(settled.online, settled.cpu_max_khz, gpu_max_khz=1015000, jetson_clocks=False, nvpmodel_id=2)
    assert rounded.mismatches(caps, None) == []
    stuck = Observed({**settled.online, 5: False}, settled.cpu_max_khz, gpu_max_khz=624750, jetson_clocks=False,
                     nvpmodel_id=2)
    problems = stuck.mismatches(caps, True)
    assert any("GPU max 624.75 MHz" in p and "1020 MHz" in p for p in problems)
    assert any(p.startswith("cpu5 offline") for p in problems)
    assert any("jetson_clocks off (wanted on)" in p for p in problems)


def test_hold_round_trips_and_a_foreign_file_is_refused_not_ignored(tmp_path):
    path = tmp_path / "hold.json"
    assert read_hold(path) is None
    write_hold(path, "job1", DeviceState(0, "15W", False))
    assert json.loads(path.read_text())["schema"] == HOLD_SCHEMA
    assert read_hold(path) == ("job1", DeviceState(0, "15W", False))
    path.write_text('{"something": "else"}')
    with pytest.raises(PowerModeError, match="not an EdgeFold power-mode hold"):
        read_hold(path)
    path.write_text("{torn")
    with pytest.raises(PowerModeError, match="unreadable"):
        read_hold(path)


def test_a_sweep_names_modes_the_board_has_before_anything_changes():
    modes = [PowerMode(0, "15W", True), PowerMode(1, "7W", False), PowerMode(2, "MAXN_SUPER", True)]
    assert resolve_modes(["MAXN_SUPER", 0], modes) == [modes[2], modes[0]]
    assert resolve_modes("all", modes) == modes
    with pytest.raises(ConfigError, match="25W") as err:
        resolve_modes(["25W", 2], modes)
    assert "15W (id 0)" in err.value.fix


@pytest.mark.parametrize("sweep", [
    {"power_modes": []}, {"power_modes": [True]}, {"power_modes": ["15W", "15W"]}, {"power_modes": "everything"},
    {"power_modes": ["15 W"]}, {"power_modes": [0], "jetson_clocks": [1]}, {"power_modes": [0], "jetson_clocks": []},
    {"power_modes": [0], "jetson_clocks": [True, True]}, {"jetson_clocks": [True]},
    {"power_modes": [0], "settle_timeout_s": 0}, {"power_modes": [0], "modes": [1]}])
def test_sweep_spec_is_strict(sweep):
    with pytest.raises(ValidationError):
        JobSpec.model_validate({"artifact": ARTIFACT, "sweep": sweep})


def test_sweep_spec_takes_names_ids_and_all():
    spec = JobSpec.model_validate({"artifact": ARTIFACT, "sweep": {"power_modes": ["MAXN_SUPER", 0],
                                                                   "jetson_clocks": [False, True]}})
    assert spec.sweep.power_modes == ["MAXN_SUPER", 0] and spec.sweep.jetson_clocks == [False, True]
    assert JobSpec.model_validate({"artifact": ARTIFACT, "sweep": {"power_modes": "all"}}).sweep.jetson_clocks is None


def test_a_sweep_result_round_trips_and_a_2_1_reader_drops_what_2_2_added():
    from device.schema import READING, RESULT_MINOR, JobResult, parse_result
    from tests.results import job_result, run

    setting = {"nvpmodel_id": 2, "nvpmodel_name": "MAXN_SUPER", "jetson_clocks": True, "online_cores": [0, 1],
             "cpu_max_khz": {0: 1728000}, "gpu_max_khz": 1020000, "settle_s": 0.4}
    document = job_result(runs=[{**run(1), "power_setting": setting}])
    document["sweep"] = {"controlled": True, "original": {"nvpmodel_id": 0, "nvpmodel_name": "15W",
                                                          "jetson_clocks": False},
                         "restored": True, "not_measured": [{"nvpmodel_id": 1, "nvpmodel_name": "7W",
                                                             "jetson_clocks": True, "kind": "skipped",
                                                             "reason": "needs a reboot"}]}
    read = parse_result(JobResult.model_validate(document).dump())
    assert read.minor == RESULT_MINOR and read.runs[0].power_setting.cpu_max_khz == {0: 1728000}
    assert read.sweep.not_measured[0].kind == "skipped"
    # An older result has neither: it reads as no sweep, not as an error.
    older = job_result()
    older["schema"] = "edgefold.result/2.1"
    assert parse_result(older).sweep is None and parse_result(older).runs[0].power_setting is None
    # Written strictly: a misspelt key fails the producer; read leniently within the major version.
    document["runs"][0]["power_setting"]["gpu_max_mhz"] = 1020.0
    with pytest.raises(ValidationError):
        JobResult.model_validate(document)
    assert JobResult.model_validate(document, context=READING).runs[0].power_setting.gpu_max_khz == 1020000


def test_sweep_windows_name_each_window_by_its_point_for_the_front():
    from device.schema import JobResult
    from tests.results import job_result, run

    setting = {"nvpmodel_id": 2, "nvpmodel_name": "MAXN_SUPER", "jetson_clocks": False, "online_cores": [0],
             "cpu_max_khz": {0: 1728000}, "gpu_max_khz": 1020000, "settle_s": 0.4}
    summary = {"power_mean_mw": 12192.0, "energy_mj_per_image": 3.1, "energy_degraded": False}
    result = JobResult.model_validate(job_result(runs=[{**run(8, summary=summary), "power_setting": setting}, run(1)]))
    maxn, plain = result.sweep_windows()
    assert maxn == {"mode": "MAXN_SUPER", "mode_id": 2, "jetson_clocks": False, "batch_size": 8, "accelerator": "gpu",
                    "latency_p50_ms": 2.0, "energy_mj_per_image": 3.1, "throughput_images_per_s": 500.0,
                    "power_mean_w": pytest.approx(12.192), "energy_degraded": False}
    assert plain["mode"] is None and plain["power_mean_w"] is None and plain["batch_size"] == 1

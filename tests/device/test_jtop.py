"""The jtop sampler against the REAL jtop service (jetson-stats 7.2.2) on a simulated Jetson tree."""

import os
import time

import pytest

from device.errors import MissingDependencyError
from device.telemetry.jtop import JtopSampler, board_total

pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="jtop's service insists on running as root")


def service(tmp_path, board):
    from tests.device.jetson_sim import JtopService

    return JtopService(tmp_path, board)


def test_board_total_follows_board_naming():
    thor = {"tot": {"name": "VIN", "power": 30000}, "rail": {"VDD_GPU": {"power": 9000}}}
    assert board_total(thor) == ("VIN", 30000.0)
    # AGX Orin has no input rail: VIN_SYS_5V0 is the 5 V system/IO rail, one of the rails the total sums.
    agx = {"tot": {"power": 16000}, "rail": {"VDD_GPU_SOC": {"power": 8000}, "VDD_CPU_CV": {"power": 2000},
                                             "VIN_SYS_5V0": {"power": 5000}, "VDDQ_VDD2_1V8AO": {"power": 1000}}}
    assert board_total(agx) == ("sum of 4 rails", 16000.0)
    # An offline rail and a power-supply entry (a battery: it carries a status) are not in the sum.
    agx["rail"]["VDD_X"] = {"power": 700, "online": False}
    agx["rail"]["battery"] = {"power": 900, "status": "Charging"}
    assert board_total(agx) == ("sum of 4 rails", 16000.0)
    # An input rail jtop left among the rails (another jtop version) is still the total.
    nano = {"tot": {"power": 9000}, "rail": {"VDD_IN": {"power": 6000}, "VDD_SOC": {"power": 1500}}}
    assert board_total(nano) == ("VDD_IN", 6000.0)


@pytest.mark.slow  # the real jtop service
@needs_root
def test_orin_nano_power_change_shows_in_the_energy(tmp_path):
    from tests.device.jetson_sim import set_current

    with service(tmp_path, "orin-nano") as svc, JtopSampler(rate_hz=10) as sampler:
        assert sampler.board_rail == "VDD_IN" and sampler.board.get("Jetpack") == "6.2"
        assert sampler.nvpmodel == "15W"
        first = sampler.read()
        assert first["board_power_mw"] == 5080 * 1200 // 1000
        assert first["rail_VDD_SOC_mw"] == 5080 * 300 // 1000 and "rail_VDD_IN_mw" not in first
        assert first["gpu_load_percent"] == 65.5 and first["temp_gpu_c"] == 46.5
        assert first["nvmap_mb"] == 512.0
        sampler.start()
        time.sleep(1.0)
        set_current(svc.root, 1, 2000)  # VDD_IN: 6.1 W → 10.2 W half-way through the window
        time.sleep(1.5)
        trace = sampler.stop()
    assert trace.errors == []
    assert trace.peak("board_power_mw") == 5080 * 2000 // 1000
    assert 6096 < trace.mean("board_power_mw") < 10160, "the window saw both power levels"


@pytest.mark.slow  # the real jtop service
@needs_root
def test_agx_orin_total_is_the_sum_of_both_monitors_rails(tmp_path):
    with service(tmp_path, "agx-orin"), JtopSampler(rate_hz=5) as sampler:
        values = sampler.read()
    rails = {name: values[f"rail_{name}_mw"] for name in ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")}
    assert rails == {"VDD_GPU_SOC": 3000, "VDD_CPU_CV": 2000, "VIN_SYS_5V0": 5000, "VDDQ_VDD2_1V8AO": 1000}
    assert sampler.board_rail == "sum of 4 rails" and sampler.summed_rails == sorted(rails)
    assert values["board_power_mw"] == sum(rails.values()) == 11000  # not VIN_SYS_5V0's 5000
    assert not any("NC" in key for key in values), "jtop skips the second monitor's NC channels"


@pytest.mark.slow  # the real jtop service
@needs_root
def test_thor_total_is_vin_not_its_module_rails(tmp_path):
    with service(tmp_path, "thor"), JtopSampler(rate_hz=5) as sampler:
        values = sampler.read()
    assert sampler.board_rail == "VIN" and values["board_power_mw"] == 19000 * 1500 // 1000
    assert values["rail_VIN_SYS_5V0_mw"] == 5000 and values["rail_VDD_GPU_mw"] == 11400


@pytest.mark.slow  # the real jtop service
@needs_root
def test_service_death_is_a_recorded_telemetry_failure(tmp_path):
    with service(tmp_path, "orin-nano") as svc, JtopSampler(rate_hz=10) as sampler:
        sampler.start()
        time.sleep(0.5)
        svc.kill()
        time.sleep(1.5)
        trace = sampler.stop()  # must not raise
    # jetson-stats 7.2.2 surfaces a dead service as a raw EOFError/ConnectionResetError or, a tick
    # later, as JtopException("Lost connection with jtop server"); each is recorded once with a count.
    assert trace.errors and all(e.startswith(("EOFError", "ConnectionResetError", "BrokenPipeError", "JtopException"))
                                for e in trace.errors), trace.errors
    assert len(trace.errors) <= 3
    assert len(trace.times_s) >= 2


def test_no_service_says_what_to_run(tmp_path, monkeypatch):
    import jtop.service

    monkeypatch.setattr(jtop.service, "JTOP_PIPE", str(tmp_path / "absent.sock"))
    with pytest.raises(MissingDependencyError, match="jtop service is not reachable") as err:
        JtopSampler().open()
    assert "systemctl restart jtop.service" in err.value.fix and "/run/jtop.sock" in err.value.fix


@pytest.mark.slow  # the real jtop service
@needs_root
def test_a_service_whose_first_value_comes_late_is_waited_for(tmp_path):
    """Planted: the simulated service publishes its first value 1 s late, as a busy board may. jtop's own client waits
    three intervals for it (0.15 s at 20 Hz) and fails with "Error connection", which failed a clean clone's
    planted-power test; EdgeFold's client waits for the first value and then reads on at jtop's pace."""
    import jtop

    from device.power import jtop_client
    from tests.device.jetson_sim import JtopService

    with JtopService(tmp_path / "raw", "orin-nano", first_stats_delay_s=1.0):
        with pytest.raises(jtop.JtopException, match="Error connection"):
            jtop.jtop(interval=0.05).start()
    with JtopService(tmp_path / "ours", "orin-nano", first_stats_delay_s=1.0):
        client = jtop_client.start(0.05)
        try:
            assert client.ok() and client.power["tot"]["power"] > 0
        finally:
            client.close()


@pytest.mark.slow  # the real jtop service
@needs_root
def test_a_client_is_handed_over_after_jtops_library_scan(tmp_path, monkeypatch):
    """jtop's constructor starts a thread that runs nvcc, opencv_version, dpkg -l and vulkaninfo (jetson-stats 7.2.2,
    jtop.py __init__ and _load_jetson_libraries); planted here as a 1.5 s scan. A job's idle window must not share the
    CPU with it, so start() returns only when it has ended."""
    import sys

    import jtop  # noqa: F401 - its package exports the class under the module's name: the module is sys.modules'

    from device.power import jtop_client

    jtop_module = sys.modules["jtop.jtop"]

    def slow_scan():
        time.sleep(1.5)  # dpkg -l and vulkaninfo on a busy board
        return {}

    monkeypatch.setattr(jtop_module, "get_libraries", slow_scan)
    with service(tmp_path, "orin-nano"):
        began = time.monotonic()
        client = jtop_client.start(0.05)
        try:
            assert not client._thread_libraries.is_alive() and time.monotonic() - began >= 1.5
            assert client.library_scan_s > 0.5 and client.ok()
        finally:
            client.close()


@pytest.mark.slow  # the real jtop service
@needs_root
def test_a_service_that_stops_answering_fails_the_start_in_bounded_time(tmp_path, monkeypatch):
    """A stopped service (SIGSTOP: its control loop answers nothing) held jtop's start() for ever: the manager's
    challenge is a blocking read, and _get_configuration's queue get takes its timeout as ``block``."""
    from device.power import jtop_client

    monkeypatch.setattr(jtop_client, "START_S", 2.0)
    with service(tmp_path, "orin-nano") as svc:
        svc.pause()
        began = time.monotonic()
        with pytest.raises(MissingDependencyError, match="did not answer a new client within 2 s") as err:
            jtop_client.start(0.05)
        assert time.monotonic() - began < 5 and "systemctl restart jtop.service" in err.value.fix


@pytest.mark.slow  # the real jtop service
@needs_root
def test_a_service_slower_than_asked_is_measured_and_its_windows_are_covered(tmp_path):
    """Planted: every tick of the simulated service takes 0.15 s, as `nvpmodel -q` and the process table may on a
    board, while its first client configured 0.05 s. jtop's ``interval`` still says 0.05 s; the sampler measures what
    the service delivered from the values' stamps, and a window in which it delivered at that pace is covered,
    not flagged as one gap after another."""
    from device.telemetry import series
    from device.telemetry.base import window_energy
    from tests.device.jetson_sim import JtopService

    with JtopService(tmp_path, "orin-nano", tick_s=0.15):
        sampler = JtopSampler(rate_hz=20)
        sampler.open()
        try:
            assert sampler.service_interval_s == pytest.approx(0.05)
            assert sampler.delivered_interval_s is not None and sampler.delivered_interval_s > 0.12
            sampler.start()
            start = time.monotonic()
            time.sleep(2.0)
            stop = time.monotonic()
            trace = sampler.stop()
        finally:
            sampler.close()
    assert 2.5 < trace.achieved_hz < 8, "the rate it delivered, not the 20 Hz asked for"
    energy = window_energy(trace, start, stop, [(start, stop, 10)], power_key=series.BOARD_POWER)
    assert energy["coverage"] > 0.9 and "low_coverage" not in energy["degraded_reasons"], energy


@pytest.mark.slow  # the real jtop service
@needs_root
def test_a_job_sampling_just_after_the_agents_probe_gets_the_rate_it_asked_for(tmp_path):
    """The service keeps its first client's interval until it has seen no client for 3 s: the agent's version probe
    (GET /v1/device, every start) at 1 s left a job that started within 3 s sampling at 1 Hz."""
    from device.power import jtop_client
    from tests.device.jetson_sim import JtopService

    with JtopService(tmp_path, "orin-nano") as svc:
        assert jtop_client.probe(svc.sock)["ok"]
        sampler = JtopSampler(rate_hz=20)
        sampler.open()
        try:
            assert sampler.delivered_interval_s is not None and sampler.delivered_interval_s < 0.1, \
                sampler.delivered_interval_s
        finally:
            sampler.close()

"""The jtop sampler against the REAL jtop service (jetson-stats 7.2.2) on a simulated Jetson tree."""

import os
import time

import pytest

from device.errors import MissingDependencyError
from device.telemetry.base import energy_per_inference
from device.telemetry.jtop import JtopSampler, board_total

pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="jtop's service insists on running as root")


def service(tmp_path, board):
    from tests.device.jetson_sim import JtopService

    return JtopService(tmp_path, board)


def test_board_total_follows_board_naming():
    thor = {"tot": {"name": "VIN", "power": 30000}, "rail": {"VDD_GPU": {"power": 9000}}}
    assert board_total(thor) == ("VIN", 30000.0)
    agx = {"tot": {"power": 16000}, "rail": {"VDD_GPU_SOC": {"power": 8000}, "VIN_SYS_5V0": {"power": 5000}}}
    assert board_total(agx) == ("VIN_SYS_5V0", 5000.0)
    unknown = {"tot": {"power": 1234}, "rail": {"VDD_X": {"power": 1234}}}
    assert board_total(unknown) == ("sum of rails (jtop tot)", 1234.0)


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
    energy = energy_per_inference(trace, inferences=100, power_key="board_power_mw", idle_mw=6096)
    assert energy["energy_above_idle_mj_per_inference"] > 0


@needs_root
def test_agx_orin_uses_vin_sys_5v0_not_the_sum(tmp_path):
    with service(tmp_path, "agx-orin"), JtopSampler(rate_hz=5) as sampler:
        values = sampler.read()
    assert sampler.board_rail == "VIN_SYS_5V0"
    assert values["board_power_mw"] == 5000.0  # jtop's own tot would say 16000 (every rail summed)


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

"""Jobs on a simulated Jetson: the agent's job process talks to the REAL jtop service (jetson-stats
7.2.2) through the socket named in the agent's config, while the test changes a rail's power.

Which rail is a board's total (AGX Orin's sum of rails, Thor's VIN) is the sampler's to read and is tested there
(tests/device/test_jtop.py) and in the energy it gives (test_planted_power.py); here, the job around it."""

import os
import time

import pytest

from tests.device.agent_process import AgentProcess, tiny_onnx

pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")
# Every test here starts the real jtop service (and the agent, or a timed window): all slow, none hidden.
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="jtop's service insists on running as root"),
              pytest.mark.slow]

JOB = {"duration_s": 3.0, "idle_s": 1.0, "warmup_iterations": 2, "telemetry": ["jtop", "host"], "sample_hz": 20}


def run_on(tmp_path, board, during=None):
    from tests.device.jetson_sim import JtopService

    tmp_path.mkdir(parents=True, exist_ok=True)
    model = tiny_onnx(tmp_path / "tiny.onnx")
    with JtopService(tmp_path, board) as svc, \
            AgentProcess(tmp_path / "data", args=("--jtop-socket", svc.sock)) as agent, agent.client() as client:
        job = client.submit({"artifact": client.upload(model), **JOB})
        if during:
            while "measuring" not in ((now := client.job(job["id"]))["progress"] or ""):
                assert now["state"] in ("queued", "running"), f"the job ended before measuring: {now['error']}"
                time.sleep(0.05)
            time.sleep(1.0 + 1.0)  # past the idle baseline, one second into the timed window
            during(svc)
        return client.wait(job["id"], timeout_s=120)


def test_orin_nano_power_change_during_a_job_shows_in_its_energy(tmp_path):
    from tests.device.jetson_sim import set_current

    for attempt in range(2):
        job = run_on(tmp_path / f"attempt{attempt}", "orin-nano", during=lambda svc: set_current(svc.root, 1, 2000))
        assert job["state"] == "succeeded", job["error"]
        run = job["result"]["runs"][0]
        summary, jtop = run["summary"], run["telemetry"]["jtop"]
        # A host busy enough to starve the jtop service's sampling (two test workers on two cores) leaves the window
        # uncovered, and the agent rightly reports no energy, saying why: that is the host, so it is measured once
        # more; a job that never reports energy still fails below.
        if summary["energy_mj_per_image"] is not None or "low_coverage" not in summary["energy_degraded_reasons"]:
            break
    assert summary["power_source"] == "jtop:VDD_IN"
    assert summary["power_idle_mw"] == pytest.approx(6096, rel=0.01)
    assert summary["power_peak_mw"] == 10160
    assert 6096 < summary["power_mean_mw"] < 10160, "the window saw both power levels"
    window_energy = summary["energy_mj_per_image"] * run["images"]
    assert 6096 * run["window_s"] < window_energy < 10160 * run["window_s"] * 1.05
    assert summary["energy_above_idle_mj_per_image"] > 0
    assert jtop["facts"]["nvpmodel"] == "15W" and jtop["facts"]["board_rail"] == "VDD_IN" and jtop["errors"] == []
    assert summary["energy_coverage"] > 0 and summary["power_sample_hz"] > 0
    assert summary["energy_degraded"] is bool(summary["energy_degraded_reasons"])
    assert jtop["series"]["gpu_freq_mhz"]["mean"] > 0 and "temp_gpu_c" in jtop["series"]
    assert summary["memory_source"] == "jtop:ram_used_mb"


def test_gpu_temperature_peak_and_lowest_clock_of_the_window_reach_the_summary(tmp_path):
    """The two fields declared on the schema (device.schema.reported) are filled from jtop's series by the
    summary, with no code of their own: the GPU heats to 71.5 °C and DVFS drops its clock to 306 MHz
    one second into the window."""
    from tests.device.jetson_sim import set_gpu_frequency, set_gpu_temperature

    def heat_and_slow(svc):
        set_gpu_temperature(svc.root, 71500)
        set_gpu_frequency(svc.root, 306000000)

    job = run_on(tmp_path, "orin-nano", during=heat_and_slow)
    assert job["state"] == "succeeded", job["error"]
    run = job["result"]["runs"][0]
    series = run["telemetry"]["jtop"]["series"]
    assert run["summary"]["gpu_temp_peak_c"] == 71.5 == series["temp_gpu_c"]["peak"]
    assert run["summary"]["gpu_freq_low_mhz"] == 306.0 == series["gpu_freq_mhz"]["low"]
    assert series["gpu_freq_mhz"]["peak"] == pytest.approx(624.75), "before the drop, the window ran at 624.75 MHz"


def test_jtop_service_dying_mid_job_is_recorded_not_fatal(tmp_path):
    job = run_on(tmp_path, "orin-nano", during=lambda svc: svc.kill())
    assert job["state"] == "succeeded", job["error"]
    run = job["result"]["runs"][0]
    assert run["telemetry"]["jtop"]["errors"], "the lost service is in the result"
    assert run["latency_p50_ms"] > 0 and run["telemetry"]["host"]["samples"] > 2
    # Killed a third of the way in: whatever energy is published is marked, with the reason.
    summary = run["summary"]
    assert summary["energy_degraded"] is True and "service_lost" in summary["energy_degraded_reasons"]
    assert summary["energy_coverage"] < 0.95 and "low_coverage" in summary["energy_degraded_reasons"]


def test_a_service_of_another_release_fails_the_job_with_the_fix_and_the_agent_names_both_versions(tmp_path):
    """The real service announcing jetson-stats 4.2.12 (a common JetPack 5 install) to this 7.2.2 client: jtop
    refuses the client. ``telemetry: auto`` must not drop jtop with a note blaming the service: the job fails
    with both versions and the fix, and the agent's banner and /v1/device say the same before any job."""
    from tests.device.jetson_sim import JtopService

    model = tiny_onnx(tmp_path / "tiny.onnx")
    with JtopService(tmp_path, "orin-nano", version="4.2.12") as svc, \
            AgentProcess(tmp_path / "data", args=("--jtop-socket", svc.sock)) as agent, agent.client() as client:
        device = client.device()
        job = client.wait(client.submit({"artifact": client.upload(model), **JOB, "telemetry": "auto"})["id"],
                          timeout_s=120)
        banner = agent.log.read_text()
    assert device["jtop"]["service"] == "4.2.12" and device["jtop"]["client"] == "7.2.2"
    assert device["jtop"]["ok"] is False and "sudo pip3 install -U jetson-stats" in device["jtop"]["fix"]
    assert "jtop: NOT usable (the jtop service runs jetson-stats 4.2.12 and this client is 7.2.2" in banner
    assert job["state"] == "failed"
    assert "the jtop service runs jetson-stats 4.2.12 and this client is 7.2.2" in job["error"]
    assert "fix: make them one release: sudo pip3 install -U jetson-stats && sudo systemctl restart jtop" in job["error"]
    assert "not reachable" not in job["error"]


def test_the_agent_and_each_result_name_the_jtop_versions(tmp_path):
    from tests.device.jetson_sim import JtopService

    model = tiny_onnx(tmp_path / "tiny.onnx")
    with JtopService(tmp_path, "orin-nano") as svc, \
            AgentProcess(tmp_path / "data", args=("--jtop-socket", svc.sock)) as agent, agent.client() as client:
        device = client.device()
        job = client.wait(client.submit({"artifact": client.upload(model), **JOB, "duration_s": 0.5})["id"],
                          timeout_s=120)
        banner = agent.log.read_text()
    assert device["jtop"] == {"client": "7.2.2", "service": "7.2.2", "ok": True, "error": None, "fix": None}
    assert "jtop: service jetson-stats 7.2.2, client 7.2.2" in banner
    assert job["state"] == "succeeded", job["error"]
    facts = job["result"]["runs"][0]["telemetry"]["jtop"]["facts"]
    assert (facts["service_version"], facts["client_version"]) == ("7.2.2", "7.2.2")


def test_a_frame_job_has_the_boards_power_over_its_frames(tmp_path):
    """A frame job on the simulated Orin Nano: one telemetry window around the whole frame timing, read from the
    REAL jtop service: the planted board power (VDD_IN, 6096 mW while nothing changes it), the energy per frame
    from it, and the temperatures the board reports."""
    from device.preprocess import Preprocess
    from tests.device.jetson_sim import JtopService

    model = tiny_onnx(tmp_path / "tiny.onnx")
    preprocess = Preprocess(input_size=16, resize=18, channels=3, mean=(0.5,) * 3, std=(0.25,) * 3).to_dict()
    with JtopService(tmp_path, "orin-nano") as svc, \
            AgentProcess(tmp_path / "data", args=("--jtop-socket", svc.sock)) as agent, agent.client() as client:
        job = client.wait(client.submit({
            "artifact": client.upload(model), "iterations": 5, "warmup_iterations": 1, "idle_s": 0.0,
            "telemetry": ["jtop", "host"], "sample_hz": 20, "preprocess": preprocess,
            "frame": {"width": 320, "height": 240, "format": "jpeg", "frames": 16, "rounds": 3}})["id"], timeout_s=120)
    assert job["state"] == "succeeded", job["error"]
    frame = job["result"]["frame"]
    power = frame["power"]
    assert power["source"] == "jtop:VDD_IN" and power["mean_mw"] == pytest.approx(6096, rel=0.01)
    assert power["peak_mw"] == pytest.approx(6096, rel=0.01) and power["window_s"] > 0
    # The window's energy over the frames run in it (16 frames one by one and 16 pipelined, in each of 3 rounds): an
    # average over the modes the rounds interleave, never one mode's time multiplied by the mix's power.
    assert frame["frames_timed"] == 3 * 2 * 16
    assert power["energy_mj_per_frame"] == pytest.approx(power["mean_mw"] * power["window_s"] / frame["frames_timed"])
    assert power["temp_peak_c"] is not None and frame["power_note"] is None

"""Sweep jobs on the simulated Orin Nano: a real agent on loopback whose job process sets power modes through
the REAL jtop service (jetson-stats 7.2.2), which runs the simulated nvpmodel and jetson_clocks; they change
the fake sysfs the service reads. What the board runs is read from the tree (``mode_state``), not from jtop."""

import json
import os
import time

import pytest

from tests.device.agent_process import AgentProcess, tiny_onnx

pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")
# Every test here starts a real agent (and most the jtop service): all slow, none hidden.
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="jtop's service insists on running as root"),
              pytest.mark.slow]

JOB = {"iterations": 20, "idle_s": 0.5, "warmup_iterations": 2, "telemetry": ["jtop", "host"], "sample_hz": 20,
       "profile": False}
HOLD = "power_mode_hold.json"


def agent_args(svc) -> tuple[str, ...]:
    return "--jtop-socket", svc.sock, "--nvpmodel-conf", str(svc.root / "etc/nvpmodel.conf")


def wait_for(predicate, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return value


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep over 15W, 7W (needs a reboot) and MAXN_SUPER with jetson_clocks on, from 15W with it off."""
    from tests.device.jetson_sim import JtopService, mode_state

    tmp = tmp_path_factory.mktemp("sweep")
    model = tiny_onnx(tmp / "tiny.onnx")
    with JtopService(tmp, "orin-nano") as svc, AgentProcess(tmp / "data", args=agent_args(svc)) as agent, \
            agent.client() as client:
        before = mode_state(svc.root)
        job = client.submit({"artifact": client.upload(model), **JOB,
                             "sweep": {"power_modes": ["15W", "7W", "MAXN_SUPER"], "jetson_clocks": [True]}})
        job = client.wait(job["id"], timeout_s=300)
        return {"job": job, "before": before, "after": mode_state(svc.root), "root": svc.root,
                "data": tmp / "data"}


def test_sweep_measures_each_mode_under_its_own_caps(swept):
    job = swept["job"]
    assert job["state"] == "succeeded", job["error"]
    assert job["result"]["schema"] == "edgefold.result/2.3"
    settings = {run["power_setting"]["nvpmodel_name"]: run for run in job["result"]["runs"]}
    assert sorted(settings) == ["15W", "MAXN_SUPER"]
    low, high = settings["15W"]["power_setting"], settings["MAXN_SUPER"]["power_setting"]
    assert (low["nvpmodel_id"], high["nvpmodel_id"]) == (0, 2)
    assert low["gpu_max_khz"] == 624750 and high["gpu_max_khz"] == 1020000
    assert set(low["cpu_max_khz"].values()) == {1510400} and set(high["cpu_max_khz"].values()) == {1728000}
    assert low["online_cores"] == high["online_cores"] == [0, 1, 2, 3, 4, 5]
    assert low["jetson_clocks"] is high["jetson_clocks"] is True
    # jetson_clocks pins the GPU at the mode's cap: the window's own telemetry shows each mode's clock.
    assert settings["15W"]["telemetry"]["jtop"]["series"]["gpu_freq_mhz"]["peak"] == pytest.approx(624.75)
    assert settings["MAXN_SUPER"]["telemetry"]["jtop"]["series"]["gpu_freq_mhz"]["low"] == pytest.approx(1020.0)
    assert settings["MAXN_SUPER"]["telemetry"]["jtop"]["facts"]["nvpmodel"] == "MAXN_SUPER"
    assert all(run["latency_p50_ms"] > 0 for run in settings.values())
    # The simulated modes' synthetic VDD_IN currents (1.2 A at 15W, 2.4 A at MAXN_SUPER, at 5.08 V).
    assert settings["15W"]["summary"]["power_mean_mw"] == pytest.approx(6096, rel=0.01)
    assert settings["MAXN_SUPER"]["summary"]["power_mean_mw"] == pytest.approx(12192, rel=0.01)


def test_a_mode_that_needs_a_reboot_is_skipped_with_the_reason_and_never_forced(swept):
    sweep = swept["job"]["result"]["sweep"]
    assert [(item["nvpmodel_name"], item["kind"]) for item in sweep["not_measured"]] == [("7W", "skipped")]
    assert "needs a reboot" in sweep["not_measured"][0]["reason"]
    assert not (swept["root"] / "reboots").exists(), "nobody forced the mode (forcing reboots a real board)"


def test_the_original_mode_and_jetson_clocks_are_restored(swept):
    before, after = swept["before"], swept["after"]
    assert (before["id"], before["jetson_clocks"]) == (0, False)
    assert after == before, "15W, jetson_clocks off, its caps and cores, as found"
    sweep = swept["job"]["result"]["sweep"]
    assert sweep["controlled"] is True and sweep["restored"] is True
    assert sweep["original"] == {"nvpmodel_id": 0, "nvpmodel_name": "15W", "jetson_clocks": False}
    assert not (swept["data"] / HOLD).exists()


def test_kill_9_mid_sweep_then_restart_restores_the_original_mode(tmp_path):
    from tests.device.jetson_sim import JtopService, mode_state

    model = tiny_onnx(tmp_path / "tiny.onnx")
    with JtopService(tmp_path, "orin-nano") as svc:
        before = mode_state(svc.root)
        agent = AgentProcess(tmp_path / "data", args=agent_args(svc)).start()
        try:
            with agent.client() as client:
                job = client.submit({"artifact": client.upload(model), **JOB, "iterations": None, "duration_s": 60.0,
                                     "sweep": {"power_modes": ["MAXN_SUPER", "15W"], "jetson_clocks": [True]}})
                wait_for(lambda: "MAXN_SUPER" in (client.job(job["id"])["progress"] or "") and
                         "measuring" in client.job(job["id"])["progress"], "the MAXN_SUPER setting's window")
            assert mode_state(svc.root)["id"] == 2 and mode_state(svc.root)["jetson_clocks"] is True
        finally:
            agent.kill()  # SIGKILL: the agent cannot clean anything up
        hold = json.loads((tmp_path / "data" / HOLD).read_text())
        assert (hold["nvpmodel_id"], hold["jetson_clocks"], hold["job"]) == (0, False, job["id"]), \
            "the original state was on disk before the first change"
        with AgentProcess(tmp_path / "data", args=agent_args(svc)) as agent, agent.client() as client:
            # Start-up kills the orphaned job process, then restores, before the agent answers.
            assert mode_state(svc.root) == before
            assert not (tmp_path / "data" / HOLD).exists()
            assert client.job(job["id"])["state"] == "interrupted"


def test_stopping_the_agent_mid_sweep_restores_before_it_exits(tmp_path):
    """SIGTERM (systemctl stop): the executor kills the job process, restores, then the agent exits."""
    from tests.device.jetson_sim import JtopService, mode_state

    model = tiny_onnx(tmp_path / "tiny.onnx")
    with JtopService(tmp_path, "orin-nano") as svc:
        before = mode_state(svc.root)
        with AgentProcess(tmp_path / "data", args=agent_args(svc)) as agent, agent.client() as client:
            job = client.submit({"artifact": client.upload(model), **JOB, "iterations": None, "duration_s": 60.0,
                                 "sweep": {"power_modes": ["MAXN_SUPER"]}})
            wait_for(lambda: "measuring" in (client.job(job["id"])["progress"] or ""), "the MAXN_SUPER window")
            assert mode_state(svc.root)["id"] == 2
        assert agent.process.returncode is not None, "the agent has exited"
        assert mode_state(svc.root) == before and not (tmp_path / "data" / HOLD).exists()


def test_a_cancelled_sweep_leaves_the_device_as_found(tmp_path):
    """The job process is SIGKILLed by the cancel: the agent restores from the hold it left."""
    from tests.device.jetson_sim import JtopService, mode_state

    model = tiny_onnx(tmp_path / "tiny.onnx")
    with JtopService(tmp_path, "orin-nano") as svc, AgentProcess(tmp_path / "data", args=agent_args(svc)) as agent, \
            agent.client() as client:
        before = mode_state(svc.root)
        job = client.submit({"artifact": client.upload(model), **JOB, "iterations": None, "duration_s": 60.0,
                             "sweep": {"power_modes": ["MAXN_SUPER", "15W"], "jetson_clocks": [True]}})
        wait_for(lambda: "MAXN_SUPER" in (client.job(job["id"])["progress"] or "") and
                 "measuring" in client.job(job["id"])["progress"], "the MAXN_SUPER setting's window")
        assert mode_state(svc.root)["id"] == 2
        assert client.cancel(job["id"])["state"] == "cancelled"
        wait_for(lambda: not (tmp_path / "data" / HOLD).exists(), "the agent's restore after the cancel")
        assert mode_state(svc.root) == before


def test_jobs_are_refused_while_the_device_is_held_and_run_once_it_is_restored(tmp_path):
    """A hold a killed sweep left, and no jtop service at start-up: the restore fails, so a job is refused with
    the reason; once the service is back, the next job's restore puts 15W back and the job runs."""
    from device.power_modes import DeviceState, write_hold
    from tests.device.jetson_sim import JtopService, mode_state, set_mode

    model = tiny_onnx(tmp_path / "tiny.onnx")
    (tmp_path / "data").mkdir()
    write_hold(tmp_path / "data" / HOLD, "0123456789ab", DeviceState(0, "15W", False))
    svc = JtopService(tmp_path, "orin-nano")  # planted, not started: its socket does not exist yet
    with AgentProcess(tmp_path / "data", args=agent_args(svc)) as agent, agent.client() as client:
        artifact = client.upload(model)
        refused = client.wait(client.submit({"artifact": artifact, **JOB})["id"], timeout_s=120)
        assert refused["state"] == "failed"
        assert "held in a power mode set by sweep job 0123456789ab" in refused["error"]
        assert "15W (id 0), jetson_clocks off" in refused["error"]
        assert "jtop service is not reachable" in refused["error"]
        assert "\n  fix: start the jtop service" in refused["error"]
        assert (tmp_path / "data" / HOLD).exists(), "a failed restore keeps the record of the original mode"
        set_mode(svc.root, 2)  # where the killed sweep left the board
        with svc:
            ran = client.wait(client.submit({"artifact": artifact, **JOB})["id"], timeout_s=120)
            assert ran["state"] == "succeeded", ran["error"]
            assert mode_state(svc.root)["id"] == 0 and not (tmp_path / "data" / HOLD).exists()
            assert ran["result"]["runs"][0]["telemetry"]["jtop"]["facts"]["nvpmodel"] == "15W"


def test_a_point_that_never_takes_effect_is_refused_not_measured(tmp_path):
    from tests.device.jetson_sim import JtopService, mode_state, set_nvpmodel_fault

    model = tiny_onnx(tmp_path / "tiny.onnx")
    with JtopService(tmp_path, "orin-nano") as svc, AgentProcess(tmp_path / "data", args=agent_args(svc)) as agent, \
            agent.client() as client:
        set_nvpmodel_fault(svc.root, "gpu_cap_stuck")
        job = client.wait(client.submit({"artifact": client.upload(model), **JOB, "sweep": {
            "power_modes": ["MAXN_SUPER", "15W"], "settle_timeout_s": 3}})["id"], timeout_s=300)
        assert job["state"] == "succeeded", job["error"]
        result = job["result"]
        assert [run["power_setting"]["nvpmodel_name"] for run in result["runs"]] == ["15W"]
        refused = result["sweep"]["not_measured"]
        assert [(item["nvpmodel_name"], item["kind"]) for item in refused] == [("MAXN_SUPER", "refused")]
        assert "GPU max 624.75 MHz (the mode caps it at 1020 MHz)" in refused[0]["reason"]
        assert mode_state(svc.root)["id"] == 0 and result["sweep"]["restored"] is True


def test_without_jtop_a_sweep_measures_the_current_mode_and_says_so(tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    args = ("--jtop-socket", str(tmp_path / "no-jtop.sock"))
    with AgentProcess(tmp_path / "data", args=args) as agent, agent.client() as client:
        job = client.wait(client.submit({"artifact": client.upload(model), **JOB, "telemetry": ["host"],
                                         "sweep": {"power_modes": "all"}})["id"], timeout_s=120)
    assert job["state"] == "succeeded", job["error"]
    sweep = job["result"]["sweep"]
    assert sweep["controlled"] is False and "measured the current mode only" in sweep["note"]
    assert "jtop service is not reachable" in sweep["note"]
    assert len(job["result"]["runs"]) == 1 and job["result"]["runs"][0]["power_setting"] is None
    assert not (tmp_path / "data" / HOLD).exists()


def test_a_conf_that_is_not_the_boards_fails_the_sweep_before_any_change(tmp_path):
    from tests.device.jetson_sim import JtopService, mode_state

    model = tiny_onnx(tmp_path / "tiny.onnx")
    with JtopService(tmp_path, "orin-nano") as svc:
        other = tmp_path / "other.conf"  # another board's file: its id 2 is not MAXN_SUPER
        other.write_text((svc.root / "etc/nvpmodel.conf").read_text().replace("NAME=MAXN_SUPER", "NAME=25W"))
        with AgentProcess(tmp_path / "data", args=("--jtop-socket", svc.sock, "--nvpmodel-conf", str(other))) \
                as agent, agent.client() as client:
            job = client.wait(client.submit({"artifact": client.upload(model), **JOB,
                                             "sweep": {"power_modes": ["MAXN_SUPER"]}})["id"], timeout_s=120)
        assert job["state"] == "failed"
        assert "disagree (id 2: jtop MAXN_SUPER, the file 25W)" in job["error"]
        assert mode_state(svc.root)["id"] == 0 and not (tmp_path / "data" / HOLD).exists()

"""The deploy stage written once (:mod:`pipeline.stages.deploy`) over a task's hooks
(:class:`pipeline.deploy.hooks.DeployHooks`): a toy task of hooks alone, measured on a real agent (loopback, real job
processes timing real ONNX files) beside a device that does not answer, so what the stage does itself (devices at
once, interleaved rounds, the cache, ``results.json``) is seen apart from classification's and detection's hooks."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from device.schema import JobSpec
from pipeline.deploy.hooks import DeployHooks, Job, Windows
from pipeline.deploy.devices import DEPLOY_SCHEMA, Device
from pipeline.stages.deploy import DeployStage
from tests.device.agent_process import AgentProcess, tiny_onnx


class ToyDeploy(DeployHooks):
    """Two rungs timed at batch 1; it records what the stage asked of it (per device, under a lock: devices run
    at once)."""

    def __init__(self, broken: bool = False):
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.broken = broken

    def _call(self, text: str) -> None:
        with self.lock:
            self.calls.append(text)

    def needs(self, ctx):
        return ("export",)

    def prepare(self, ctx, workdir):
        self._call("prepare")
        (workdir / "scratch.npy").write_bytes(b"removed by cleanup")
        return SimpleNamespace(artifacts={rung: tiny_onnx(ctx.run_dir / f"{rung}.onnx", seed=seed)
                                          for seed, rung in enumerate(("teacher", "student"))},
                               scratch=workdir / "scratch.npy")

    def windows(self, ctx, session, plan):
        self._call(f"windows {session.device.name}")
        if self.broken:
            raise RuntimeError("a task's bug")

        def spec(job, round_index):
            return JobSpec(artifact=session.digest(job.path), runtime=session.runtime, precision="fp32",
                           batch_sizes=[1], iterations=3, warmup_iterations=1, idle_s=0, profile=False,
                           timeout_s=600, label=f"toy/{job.rung}/round{round_index + 1}")

        return Windows([Job(rung, path) for rung, path in plan.artifacts.items()], spec,
                       lambda job, round_index: f"{job.rung} round {round_index + 1}")

    def record(self, ctx, outcome, plan, rounds):
        self._call(f"record {outcome['name']}")
        for job, records in rounds.items():
            outcome["rungs"][job.rung] = {"state": records[0]["state"], "windows": len(records),
                                          "labels": [r["spec"]["label"] for r in records if "spec" in r]}

    def after(self, ctx, plan, outcome, open_session):
        self._call(f"after {outcome['name']} {outcome['status']}")

    def results(self, ctx, plan):
        self._call("results")
        return {"toy": True}

    def cleanup(self, plan):
        self._call("cleanup")
        plan.scratch.unlink()


def _ctx(run_dir, devices, rounds=2):
    deploy = SimpleNamespace(runtime="onnxruntime", rounds=rounds, retries=0, parallel_devices=2)
    return SimpleNamespace(run_dir=run_dir, devices=devices, log=lambda line: None, recipe=SimpleNamespace(
        name="toy", deploy=deploy, section=lambda name: {"rounds": rounds}))


def test_every_device_gets_the_tasks_jobs_in_interleaved_rounds_and_one_lost_device_stops_no_other(tmp_path):
    run_dir, work = tmp_path / "run", tmp_path / "run" / "deploy"
    work.mkdir(parents=True)
    hooks = ToyDeploy()
    stage = DeployStage(hooks)
    assert stage.code_modules == (__name__, "device.jobs.jobrun", "device.service.agent")
    with AgentProcess(tmp_path / "agent") as agent:
        devices = [Device("board", "edge", agent.url, "edge", str(agent.token_file)),
                   Device("gone", "edge", "http://127.0.0.1:9", "edge", str(agent.token_file))]
        result = stage.run(_ctx(run_dir, devices), work)
        again = stage.run(_ctx(run_dir, devices), work)
    results = json.loads((work / "results.json").read_text())
    board, gone = results["devices"]
    assert board["status"] == "ok" and gone["status"] == "unreachable" and gone["rungs"] == {}
    # Every round times every rung once, in the task's order; the round is in the job.
    assert board["rungs"]["teacher"] == {"state": "succeeded", "windows": 2,
                                         "labels": ["toy/teacher/round1", "toy/teacher/round2"]}
    assert board["rungs"]["student"]["windows"] == 2
    assert results["schema"] == DEPLOY_SCHEMA and results["toy"] is True
    assert set(results["artifacts"]) == {"teacher", "student"} and len(results["artifacts"]["teacher"]["sha256"]) == 64
    assert result.metrics == {"devices": {"board": "ok", "gone": "unreachable"}, "jobs_succeeded": 2,
                              "jobs_reused": 0, "jobs": 4, "rounds": 2, "windows": 4}
    assert again.metrics["jobs_reused"] == 4, "a second run measures nothing again: same artifact, device and job"
    assert stage.summary(again.metrics) == ("2/4 rungs measured in 2 interleaved rounds (4 windows reused); "
                                            "board ok, gone unreachable")
    assert not (work / "scratch.npy").exists(), "the plan's files are the task's to remove"
    first_run = hooks.calls[:len(hooks.calls) // 2]
    assert first_run[0] == "prepare" and first_run[-2:] == ["results", "cleanup"]
    for name, status in (("board", "ok"), ("gone", "unreachable")):
        # After its session: a device's rungs are recorded, then what the task measures after the ladder.
        assert first_run.index(f"record {name}") < first_run.index(f"after {name} {status}")
    assert "windows gone" not in first_run, "an agent that does not answer is asked for no jobs"


def test_the_plans_files_are_removed_however_the_stage_ends(tmp_path):
    run_dir, work = tmp_path / "run", tmp_path / "run" / "deploy"
    work.mkdir(parents=True)
    hooks = ToyDeploy(broken=True)
    with AgentProcess(tmp_path / "agent") as agent:
        devices = [Device("board", "edge", agent.url, "edge", str(agent.token_file))]
        with pytest.raises(RuntimeError, match="a task's bug"):
            DeployStage(hooks).run(_ctx(run_dir, devices), work)
    assert hooks.calls[-1] == "cleanup" and "results" not in hooks.calls, "no results.json from a failed stage"
    assert not (work / "scratch.npy").exists() and not (work / "results.json").exists()

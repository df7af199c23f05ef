"""The deploy stage against a real loopback agent: a job that outlasts the wait fails its rung, not
the device, and is cancelled on the agent."""

import threading
from types import SimpleNamespace

import pytest

from device.client import AgentClient
from pipeline.deploy.devices import Device
from pipeline.core.recipe import DeployConfig
from pipeline.stages.deploy import DeployStage
from pipeline.tasks.classification.deployed import ClassificationDeploy, Plan
from tests.device.agent_process import AgentProcess, tiny_onnx

PREPROCESS = {"input_size": 16, "resize": 16, "channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3}
HUNG = "t/pruned/round1"  # the job label deploy gives the pruned rung's first round under the label "t"


class Context:
    """The stage's context, as far as one device's deploy uses it: the recipe's deploy section and its log."""

    def __init__(self, cfg: DeployConfig):
        self.recipe = SimpleNamespace(name="t", deploy=cfg)
        self.lines = []

    def log(self, line: str) -> None:
        self.lines.append(line)


def deploy_one(device: Device, models: dict, cfg: DeployConfig, cache, programs=None) -> tuple[dict, Context]:
    """One device's deploy by the shared stage with classification's hooks, as the stage runs it for each device."""
    ctx = Context(cfg)
    plan = Plan(models, programs or {}, PREPROCESS, "t", None, None)
    return DeployStage(ClassificationDeploy())._device(ctx, device, device.url, None, plan, cache, threading.Lock()), ctx


@pytest.mark.slow
def test_a_job_that_outlasts_the_wait_fails_its_rung_is_cancelled_and_the_other_rungs_run(tmp_path, monkeypatch):
    # The agent kills a job at its own timeout_s and deploy waits 120 s longer: the wait runs out first only when a
    # job sat queued or the agent could not kill it. The hung job's wait is cut to 3 s to stand in for both; the
    # agent, its jobs, the hang (EDGEFOLD_AGENT_FAULT) and the cancel are real.
    wait = AgentClient.wait

    def short_wait(self, job_id, timeout_s=3600.0, **kwargs):
        return wait(self, job_id, 3.0 if self.job(job_id)["spec"]["label"] == HUNG else timeout_s, **kwargs)

    monkeypatch.setattr(AgentClient, "wait", short_wait)
    models = {rung: tiny_onnx(tmp_path / f"{rung}.onnx", seed=seed)
              for seed, rung in enumerate(("teacher", "pruned", "student"))}
    cfg = DeployConfig(rungs=list(models), batch_sizes=[1], duration_s=0.1, rounds=1, warmup_iterations=1, idle_s=0,
                       job_timeout_s=600)
    (tmp_path / "cache").mkdir()
    with AgentProcess(tmp_path / "agent", env={"EDGEFOLD_AGENT_FAULT": f"{HUNG}=hang"}) as agent:
        device = Device("edge", "edge", agent.url, "edge", str(agent.token_file))
        outcome, _ = deploy_one(device, models, cfg, tmp_path / "cache")
        with agent.client() as client:
            jobs = {job["spec"]["label"]: job for job in client.jobs()}
    assert outcome["status"] == "ok" and outcome["error"] is None, "the device answered all along: not lost"
    rungs = outcome["rungs"]
    assert rungs["teacher"]["state"] == "succeeded" and rungs["student"]["state"] == "succeeded", \
        "the rung after the late one still ran"
    assert rungs["pruned"]["state"] == "failed"
    assert "after waiting 3 s" in rungs["pruned"]["error"] and "cancelled on the agent" in rungs["pruned"]["error"]
    assert jobs[HUNG]["state"] == "cancelled", "the late job no longer holds the agent's queue"
    assert len(jobs) == 3, "not retried: a second attempt would wait as long"

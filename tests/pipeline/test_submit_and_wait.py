"""The one job loop every task's deploy runs (:func:`pipeline.deploy.jobs.submit_and_wait`), against a real loopback agent."""

import pytest

from device.client import AgentClient
from device.schema import parse_result
from pipeline.deploy.jobs import submit_and_wait
from tests.device.agent_process import AgentProcess, tiny_onnx

pytestmark = pytest.mark.slow  # a real agent

JOB = {"iterations": 5, "warmup_iterations": 1, "idle_s": 0.0, "telemetry": ["host"], "profile": False}


def test_a_job_is_measured_and_one_past_its_wait_is_cancelled_not_retried(tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    with AgentProcess(tmp_path / "data") as agent, agent.client() as client:
        digest = client.upload(model)
        done = submit_and_wait(client, model, {"artifact": digest, **JOB}, wait_s=120, retries=1)
        assert done["state"] == "succeeded" and done["attempts"] == 1
        assert parse_result(done["result"], "test").runs[0].latency_p50_ms > 0
        slow = {"artifact": digest, **JOB, "iterations": None, "duration_s": 60.0}
        late = submit_and_wait(client, model, slow, wait_s=2, retries=3)
        assert late["state"] == "failed" and "cancelled on the agent" in late["error"], late
        assert not late.get("unreachable"), "the agent answered: the device is not lost"
        jobs = client.jobs()
        assert len(jobs) == 2, "a job past its wait is not resubmitted"
        assert {job["state"] for job in jobs} == {"succeeded", "cancelled"}


def test_an_agent_that_cannot_be_reached_is_unreachable(tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    with AgentClient("http://127.0.0.1:9", "token", timeout_s=5) as client:
        gone = submit_and_wait(client, model, {"artifact": "0" * 64, **JOB}, wait_s=10, retries=2)
    assert gone["state"] == "failed" and gone["unreachable"] is True

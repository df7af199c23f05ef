"""One device's measuring session, shared by every task's deploy stage, against a real loopback agent: a window is
measured once and reused from the cache after; an unreachable agent is the outcome's, not an exception."""

from device.schema import JobSpec
from pipeline.deploy.session import DeviceSession
from pipeline.deploy.devices import Device
from tests.device.agent_process import AgentProcess, tiny_onnx


def _spec(session: DeviceSession, path, label: str) -> JobSpec:
    return JobSpec(artifact=session.digest(path), runtime=session.runtime, batch_sizes=[1], duration_s=0.1,
                   warmup_iterations=1, idle_s=0, profile=False, label=label)


def test_a_window_is_measured_once_then_reused_and_the_runtime_choice_is_said(tmp_path):
    model = tiny_onnx(tmp_path / "m.onnx")
    lines = []
    (tmp_path / "cache").mkdir()
    with AgentProcess(tmp_path / "agent") as agent:
        device = Device("edge", "edge", agent.url, "edge", str(agent.token_file))
        with DeviceSession(device, agent.url, None, "auto", tmp_path / "cache", ("device.jobs.jobrun",),
                           lines.append) as session:
            assert session.open() and session.outcome["fingerprint"]["edgefold"]
            first = session.window("m", model, _spec(session, model, "r1"), 0, retries=0, wait_s=120,
                                   announce="m round 1")
            again = session.window("m", model, _spec(session, model, "another label"), 0, retries=0, wait_s=120)
            other_round = session.window("m", model, _spec(session, model, "r2"), 1, retries=0, wait_s=120)
        with agent.client() as client:
            jobs = client.jobs()
    assert first["state"] == "succeeded" and first["result"]["runs"][0]["batch_size"] == 1
    assert again == first, "the label is not part of the key: the same window, from the cache"
    assert other_round["job_id"] != first["job_id"], "another round is another window"
    assert len(jobs) == 2 and session.outcome["reused"] == ["m"]
    assert any("m round 1" in line for line in lines) and any("round 1 reused" in line for line in lines)
    assert session.outcome["runtime"] == "onnxruntime" and session.outcome["status"] == "ok"
    # auto without TensorRT here: the reason is in the outcome and the log, for the report to print beside figures
    assert session.outcome["runtime_fallback"].startswith("ONNX Runtime ran instead of TensorRT")
    assert any(session.outcome["runtime_fallback"] in line for line in lines)


def test_an_agent_that_does_not_answer_is_the_outcomes_unreachable(tmp_path):
    token = tmp_path / "token"
    token.write_text("x" * 32)
    device = Device("gone", "edge", "http://127.0.0.1:9", "edge", str(token))
    with DeviceSession(device, device.url, None, "auto", tmp_path, ("device.jobs.jobrun",), print) as session:
        assert not session.open()
    assert session.outcome["status"] == "unreachable" and session.outcome["error"]

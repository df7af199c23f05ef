"""``edgefold diverge`` on a finished run: the rung and device checked, the answer written and shown in the report.

The run is the shared ``tiny`` run, copied; its deploy record is pointed at a real agent started here (a real uvicorn
server on loopback running ONNX Runtime) because the loopback agent the run used is gone when it ends. That agent's
arithmetic is the reference's, so the answer is "agrees", in one debug job; the search itself, with a planted
deviation, is tested against the TensorRT stand-in in tests/device/test_diverge.py.
"""

from __future__ import annotations

import json
import shutil

import pytest

from device.errors import ConfigError


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    target = tmp_path / "runs" / "tiny" / "shared"
    shutil.copytree(tiny_run.run_dir, target, symlinks=True)
    return target


def _point_deploy_at(run_dir, name, url, state="succeeded"):
    path = run_dir / "deploy" / "results.json"
    results = json.loads(path.read_text())
    results["devices"][0].update(name=name, url=url)
    results["devices"][0]["rungs"]["student_int8"]["state"] = state
    path.write_text(json.dumps(results))


def test_diverge_answers_on_a_finished_run_and_the_report_shows_it(run_copy, tmp_path):
    from device.service.loopback import LoopbackAgent
    from pipeline.cli import main

    with LoopbackAgent(tmp_path / "agent") as agent:
        _point_deploy_at(run_copy, "bench-agent", agent.url)
        code = main(["diverge", str(run_copy), "--rung", "student_int8", "--device", "bench-agent", "--images", "3",
                     "--chunk", "2", "--token-file", str(agent.token_file)])
    assert code == 0
    answer = json.loads((run_copy / "diverge" / "student_int8@bench-agent.json").read_text())
    assert answer["first_parting"] is None and answer["jobs"] == 1 and answer["images"] == 3
    assert len(answer["probes"][0]["tensors"]) == 2 and answer["tensors_in_order"] > 10
    assert all(m["relative_error"] < 1e-4 for m in answer["probes"][0]["metrics"].values())
    report = (run_copy / "report" / "report.md").read_text()
    assert "## Where the engine parts from the model" in report
    assert "student_int8 on bench-agent: the debug engine's output (built with outputs marked" in report
    assert "agrees with ONNX Runtime's on 3 images" in report


@pytest.mark.parametrize("rung, device, state, message", [
    ("student_int9", "bench-agent", "succeeded", "has no rung 'student_int9'; it deployed"),
    ("student_int8", "jetson-nx", "succeeded", "did not deploy to 'jetson-nx'"),
    ("student_int8", "bench-agent", "failed", "bench-agent has not built student_int8: failed"),
    ("student_int8", "loopback", "succeeded", "the loopback agent runs ONNX Runtime on this host"),
])
def test_a_rung_or_device_the_run_does_not_have_is_refused_before_any_job(run_copy, rung, device, state, message):
    from pipeline.deploy.diverge import diverge_run
    from pipeline.tasks.classification.deployed import ClassificationDeploy

    url = "loopback" if device == "loopback" else "http://127.0.0.1:9"  # nothing listens: no job may be tried
    _point_deploy_at(run_copy, "loopback" if device == "loopback" else "bench-agent", url, state)
    with pytest.raises(ConfigError, match=message):
        diverge_run(run_copy, rung, device, "token", inputs=ClassificationDeploy().evaluation_inputs)


def test_a_run_searches_each_deviation_once_by_itself_and_a_failed_search_is_logged(run_copy, monkeypatch):
    """``edgefold run`` after its report: each rung × device the headline says parts (McNemar) is searched once, on a
    device the run was given; an agent that cannot be reached leaves the run as it was, with the reason logged."""
    from pipeline.cli import _diverge_deviations
    from pipeline.core.manifest import Manifest
    from pipeline.deploy.devices import Device

    report = run_copy / "report" / "results.json"
    results = json.loads(report.read_text())
    results["headline"]["device_deviations"] = [
        {"rung": "student_int8", "device": "orin"}, {"rung": "student_int8 (batch 1)", "device": "orin"},
        {"rung": "student_int8", "device": "not-given"}]
    report.write_text(json.dumps(results))
    _point_deploy_at(run_copy, "orin", "http://127.0.0.1:9")  # nothing listens there
    logged, searched = [], []

    class Ctx:
        run_dir, manifest = run_copy, Manifest.load(run_copy)

        @staticmethod
        def log(text):
            logged.append(text)

    import pipeline.deploy.diverge

    real = pipeline.deploy.diverge.diverge_run
    monkeypatch.setattr(pipeline.deploy.diverge, "diverge_run", lambda *a, **k: searched.append(a[1:3]) or real(*a, **k))
    monkeypatch.setenv("EDGEFOLD_AGENT_TOKEN", "secret")
    _diverge_deviations(Ctx, [Device(name="orin", role="edge", url="http://127.0.0.1:9", group="orin")])
    assert searched == [("student_int8", "orin")]
    assert len(logged) == 2 and "student_int8 on orin: not searched: agent http://127.0.0.1:9 is unreachable" in \
        logged[-1]
    assert not (run_copy / "diverge").exists() or not list((run_copy / "diverge").glob("*.json"))

"""A detection job on a real loopback agent: the sidecar is an artifact, checked on upload, and the engine that was
timed returns decoded, NMS'd detections with the network's and the post-processing's time apart."""

import json

import numpy as np
import pytest
import torch

from device.client import AgentError
from device.scoring.detection_post import load_head_spec, postprocess
from device.runners import make_runner
from pipeline.tasks.detection.export import export_detector, network_inputs, sidecar_path
from pipeline.tasks.detection.models import build_detector
from tests.device.agent_process import AgentProcess
from tests.slow import slow_fixture

QUICK = {"runtime": "onnxruntime", "iterations": 3, "warmup_iterations": 0, "idle_s": 0, "batch_sizes": [1, 4],
         "telemetry": ["host"], "profile": False}


@pytest.fixture(scope="module")
@slow_fixture
def agent(tmp_path_factory):
    with AgentProcess(tmp_path_factory.mktemp("agent") / "data") as process:
        yield process


@pytest.fixture(scope="module")
def detector_onnx(tmp_path_factory):
    torch.manual_seed(0)
    model = build_detector("tiny_fcos", 3).eval()
    with torch.no_grad():  # spread scores: an untrained head scores every anchor alike
        for name, parameter in model.head.named_parameters():
            if name.endswith("weight") and parameter.ndim == 4:
                parameter.normal_(0, 0.2)
    path = tmp_path_factory.mktemp("det") / "student.onnx"
    export_detector(model, path, "tiny_fcos", 64, 0, 17)
    return path


def test_loopback_detections_equal_the_hosts_with_postprocessing_timed_apart(agent, detector_onnx, tmp_path):
    images = network_inputs((np.random.default_rng(0).random((7, 64, 64)) * 255).astype(np.uint8), 64)
    eval_path = tmp_path / "eval.npy"
    np.save(eval_path, images)
    with make_runner("onnxruntime", str(detector_onnx)) as host:
        expected = postprocess(load_head_spec(sidecar_path(detector_onnx)), host.infer(images))
    with agent.client() as client:
        sha, eval_sha, head_sha = (client.upload(p) for p in (detector_onnx, eval_path, sidecar_path(detector_onnx)))
        assert client._request("GET", f"/v1/artifacts/{head_sha}").json()["kind"] == "detection-head"
        job = client.wait(client.submit({"artifact": sha, **QUICK, "evaluation": {
            "artifact": eval_sha, "images": 7, "head": head_sha}})["id"], timeout_s=120)
    assert job["state"] == "succeeded", job["error"]
    evaluation = job["result"]["evaluation"]
    assert evaluation["batch_size"] == 4 and evaluation["network_s"] > 0 and evaluation["postprocess_s"] > 0
    assert evaluation["predictions"] == [] and len(evaluation["detections"]) == 7
    for got, want in zip(evaluation["detections"], expected):
        assert len(got["labels"]) == len(want["labels"]) > 0
        assert got["labels"] == want["labels"].tolist()
        np.testing.assert_allclose(np.asarray(got["boxes"]).reshape(-1, 4), want["boxes"], atol=1e-4)


def test_a_sidecar_that_does_not_decode_is_refused_on_upload(agent, detector_onnx, tmp_path):
    sidecar = json.loads(sidecar_path(detector_onnx).read_text())
    sidecar["anchors"] = sidecar["anchors"][:3]
    bad = tmp_path / "bad.head.json"
    bad.write_text(json.dumps(sidecar))
    with agent.client() as client:
        with pytest.raises(AgentError, match="not a detection sidecar: .*anchors_per_level") as err:
            client.upload(bad)
    assert err.value.status == 422


def test_every_engine_of_a_detection_job_is_scored_through_the_devices_decode(detector_onnx, tmp_path):
    """A runtime that builds one engine per measured batch (TensorRT) gets each scored: here ONNX Runtime's runner
    declares per-batch engines (``batch_sizes``, as the TensorRT runner sets it), since neither TensorRT nor its
    stand-in runs this multi-output detector on this machine. The largest batch comes first."""
    from device.files import sha256_file
    from device.jobs.jobrun import evaluate_engine, timed_engines
    from device.schema import JobSpec

    images = network_inputs((np.random.default_rng(1).random((5, 64, 64)) * 255).astype(np.uint8), 64)
    eval_path = tmp_path / "eval.npy"
    np.save(eval_path, images)
    head = sidecar_path(detector_onnx)
    spec = JobSpec.model_validate({**QUICK, "artifact": sha256_file(detector_onnx), "evaluation": {
        "artifact": sha256_file(eval_path), "images": 5, "head": sha256_file(head)}})
    job = {"evaluation_path": str(eval_path), "head_path": str(head)}
    with make_runner("onnxruntime", str(detector_onnx)) as runner:
        assert [batch for _, _, batch in timed_engines({None: runner}, [1, 4])] == [4]  # one model: scored once
        runner.batch_sizes = (1, 4)
        engines = timed_engines({None: runner}, [1, 4])
        assert [(accelerator, batch) for accelerator, _, batch in engines] == [(None, 4), (None, 1)]
        swept = timed_engines({"gpu": runner, "dla0": runner}, [1, 4])  # a sweep: each accelerator's engines too
        assert [(accelerator, batch) for accelerator, _, batch in swept] == [("gpu", 4), ("gpu", 1), ("dla0", 4),
                                                                              ("dla0", 1)]
        scored = [evaluate_engine(spec, job, timed, (3, 64, 64), batch) for _, timed, batch in engines]
    assert [s["batch_size"] for s in scored] == [4, 1] and all(len(s["detections"]) == 5 for s in scored)
    for got, want in zip(scored[1]["detections"], scored[0]["detections"]):
        assert got["labels"] == want["labels"]

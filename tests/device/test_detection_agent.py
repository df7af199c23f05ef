"""A detection job on a real loopback agent: the sidecar is an artifact, checked on upload, and the engine that was
timed returns decoded, NMS'd detections with the network's and the post-processing's time apart (issue 28)."""

import json

import numpy as np
import pytest
import torch

from device.client import AgentError
from device.detection_post import load_head_spec, postprocess
from device.runners import make_runner
from pipeline.detection_export import export_detector, network_inputs, sidecar_path
from pipeline.detection_models import build_detector
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

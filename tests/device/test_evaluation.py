"""Scoring the engine that was timed, on a real agent served on loopback with ONNX Runtime: the
evaluation set is an artifact like a model, checked on upload, run once after the timed windows, and the
device's predictions are the host's when both run the same program."""

import numpy as np
import pytest

from device.client import AgentError
from device.files import sha256_file
from device.runners import make_runner
from tests.device.agent_process import AgentProcess, tiny_onnx
from tests.slow import slow_fixture

QUICK = {"iterations": 3, "warmup_iterations": 0, "idle_s": 0, "batch_sizes": [1, 8], "telemetry": ["host"],
         "profile": False}


@pytest.fixture(scope="module")
@slow_fixture
def agent(tmp_path_factory):
    """One real agent for the module: every test uploads its own artifacts (named by their hashes)."""
    with AgentProcess(tmp_path_factory.mktemp("agent") / "data") as process:
        yield process


def test_loopback_device_predictions_equal_the_hosts(agent, tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    images = np.random.default_rng(0).standard_normal((21, 3, 16, 16)).astype(np.float32)
    eval_path = tmp_path / "eval.npy"
    np.save(eval_path, images)
    with make_runner("onnxruntime", str(model)) as host:
        expected = np.argsort(-host.infer(images), axis=1, kind="stable")[:, :5]
    with agent.client() as client:
        sha, eval_sha = client.upload(model), client.upload(eval_path)
        assert client._request("GET", f"/v1/artifacts/{eval_sha}").json()["kind"] == "eval-set"
        job = client.wait(client.submit({"artifact": sha, **QUICK,
                                         "evaluation": {"artifact": eval_sha, "images": 21, "top_k": 5}})["id"],
                          timeout_s=120)
        assert job["state"] == "succeeded", job["error"]
        evaluation = job["result"]["evaluation"]
        assert evaluation["batch_size"] == 8 and evaluation["images"] == 21 and evaluation["seconds"] > 0
        assert np.array_equal(np.asarray(evaluation["predictions"]), expected)
        # Without an evaluation set in the spec the job scores nothing (rounds after the first).
        plain = client.wait(client.submit({"artifact": sha, **QUICK})["id"], timeout_s=120)
        assert plain["result"]["evaluation"] is None


@pytest.mark.parametrize("array, message", [
    (np.zeros((4, 3, 16, 16), np.float64), "float32 images N×C×H×W"),
    (np.zeros((4, 16, 16), np.float32), "float32 images N×C×H×W"),
])
def test_an_evaluation_set_that_is_not_float32_nchw_is_refused_on_upload(agent, tmp_path, array, message):
    path = tmp_path / "bad.npy"
    np.save(path, array)
    with agent.client() as client:
        with pytest.raises(AgentError, match=message) as err:
            client.upload(path)
        assert err.value.status == 422
        assert not list((agent.data_dir / "artifacts").glob(f"{sha256_file(path)}*"))

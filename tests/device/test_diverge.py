"""Where an engine parts from its model: debug jobs that mark tensors as outputs, and the bisection over them.

TensorRT cannot run here: the TensorRT tests use the stand-in (tests/device/trt_standin.py), whose engines compute
with ONNX Runtime and can carry a deviation planted at a named tensor (``planted_deviation``). The HTTP test runs a
real agent process on loopback with ONNX Runtime.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from device.files import sha256_file
from device.schema import JobResult, JobSpec
from tests.device import trt_standin

LAYERS = 12


def deep_chain(path, layers: int = LAYERS, size: int = 8, seed: int = 0):
    """A float chain of ``layers`` Conv + Relu pairs and a pooled Gemm head: 2·layers + 2 tensors to search."""
    rng = np.random.default_rng(seed)
    nodes, inits, previous = [], [], "input"
    for index in range(layers):
        channels_in = 3 if index == 0 else 4
        inits.append(numpy_helper.from_array((rng.standard_normal((4, channels_in, 3, 3)) * 0.4).astype(np.float32),
                                             f"w{index}"))
        nodes += [helper.make_node("Conv", [previous, f"w{index}"], [f"conv{index}"], name=f"conv{index}",
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"conv{index}"], [f"relu{index}"], name=f"relu{index}")]
        previous = f"relu{index}"
    inits += [numpy_helper.from_array(rng.standard_normal((10, 4)).astype(np.float32), "fc_w"),
              numpy_helper.from_array(np.zeros(10, np.float32), "fc_b")]
    nodes += [helper.make_node("GlobalAveragePool", [previous], ["pool"], name="pool"),
              helper.make_node("Flatten", ["pool"], ["flat"], name="flatten"),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="head", transB=1)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                            ["batch", 3, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def chain(tmp_path):
    return deep_chain(tmp_path / "chain.onnx")


@pytest.fixture
def images(tmp_path):
    path = tmp_path / "eval.npy"
    np.save(path, np.random.default_rng(1).standard_normal((6, 3, 8, 8)).astype(np.float32))
    return path


def _debug_job(model, eval_path, tensors, tmp_path, images=3, runtime="tensorrt", batch=2, max_bytes=1 << 20):
    return {"spec": {"artifact": sha256_file(model), "runtime": runtime, "precision": "fp32", "batch_sizes": [batch],
                     "iterations": 2, "telemetry": ["host"], "profile": False,
                     "evaluation": {"artifact": sha256_file(eval_path), "images": 6},
                     "diverge": {"tensors": tensors, "images": images, "max_bytes": max_bytes}},
            "artifact_path": str(model), "engine_cache": str(tmp_path / "engines"), "evaluation_path": str(eval_path)}


def _in_process_probe(monkeypatch, tmp_path, model, eval_path, reference, jobs):
    """A bisect probe running each debug job in this process against the TensorRT stand-in."""
    from device.jobs.debug_tensors import TENSORS_FILE, read_tensors
    from device.jobs.jobrun import run_job
    from pipeline.deploy.diverge import compare

    def probe(names):
        job_dir = tmp_path / f"job{len(jobs)}"
        job_dir.mkdir()
        result = JobResult.model_validate(run_job(_debug_job(model, eval_path, names, tmp_path), job_dir))
        jobs.append(result)
        device = read_tensors((job_dir / TENSORS_FILE).read_bytes(), [t.name for t in result.diverge.tensors])
        return {name: compare(device[name], reference[name]) for name in names}, job_dir.name

    return probe


def test_a_debug_job_returns_the_marked_tensors_of_the_first_images(monkeypatch, tmp_path, chain, images):
    """The stand-in engine with three tensors marked: each comes back for the 3 images asked (batch 2: the second
    call padded, the padding dropped), equal to ONNX Runtime's values, with the layer that writes it; nothing timed."""
    from device.jobs.debug_tensors import TENSORS_FILE, read_tensors
    from device.jobs.jobrun import run_job
    from pipeline.deploy.diverge import reference_values

    trt_standin.install(monkeypatch, "10.3.0")
    names = ["conv0", "relu5", "logits"]
    result = JobResult.model_validate(run_job(_debug_job(chain, images, names, tmp_path), tmp_path))
    assert result.runs == [] and result.evaluation is None and result.runtime.name == "tensorrt"
    # The stand-in lists the marked outputs before the model's own (TensorRT keeps no order): the runner still reads
    # the model's output for its answer.
    assert result.smoke.output_shape == [2, 10]
    assert [(t.name, t.shape, t.layer) for t in result.diverge.tensors] == [
        ("conv0", [3, 4, 8, 8], "conv0"), ("relu5", [3, 4, 8, 8], "relu5"), ("logits", [3, 10], "head")]
    blob = (tmp_path / TENSORS_FILE).read_bytes()
    assert result.diverge.size_bytes == len(blob)
    device = read_tensors(blob, names)
    expected = reference_values(chain, names, np.load(images)[:3], 2)
    for name in names:
        np.testing.assert_allclose(device[name], expected[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3])
def test_a_deviation_planted_at_a_named_layer_is_found_within_log2_plus_one_jobs(monkeypatch, tmp_path, chain, images,
                                                                                 chunk):
    """The planted truth: the stand-in's engines compute ``relu7`` three times too large (and everything after it
    from that). Bisection names relu7 as the first tensor that parts, conv7 before it as agreeing, in at most
    ⌈log2(n)⌉ + 1 debug jobs with one tensor a job, and in fewer with three."""
    from pipeline.deploy.diverge import bisect, candidates, reference_values

    trt = trt_standin.install(monkeypatch, "10.3.0")
    trt.planted_deviation = ("relu7", 3.0)
    order = candidates(chain)
    assert [c.name for c in order][:3] == ["conv0", "relu0", "conv1"] and order[-1].name == "logits"
    assert len(order) == 2 * LAYERS + 2  # the convs, the relus, the pool, the logits (Flatten is no layer's answer)
    reference = reference_values(chain, [c.name for c in order], np.load(images)[:3], 2)
    jobs: list = []
    search = bisect(order, _in_process_probe(monkeypatch, tmp_path, chain, images, reference, jobs), chunk)
    assert order[search.first].name == "relu7" and order[search.last_agreeing].name == "conv7"
    bound = math.ceil(math.log2(len(order))) + 1
    assert len(jobs) == len(search.probes) <= bound
    assert all(len(job.diverge.tensors) <= chunk for job in jobs)
    if chunk > 1:
        assert len(jobs) <= math.ceil(math.log(len(order), chunk + 1)) + 1
    document = search.document()
    assert document["first_parting"]["name"] == "relu7" and document["first_parting"]["relative_error"] == \
        pytest.approx(2.0, rel=1e-4)
    assert document["probes"][0]["tensors"][-1] == "logits" and "logits" in document["probes"][0]["parted"]


def test_an_engine_whose_numbers_overflow_is_searched_not_refused(monkeypatch, tmp_path, chain, images):
    """A deviation that makes values infinite (an FP16 overflow's mark): a benchmark job's smoke check refuses the
    engine, a debug job goes on, and the search names the first tensor that is not finite."""
    from device.errors import EdgeFoldError
    from device.jobs.jobrun import run_job
    from pipeline.deploy.diverge import bisect, candidates, reference_values

    trt = trt_standin.install(monkeypatch, "10.3.0")
    trt.planted_deviation = ("conv4", float("inf"))
    spec = _debug_job(chain, images, ["relu1"], tmp_path)
    benchmark = {**spec, "spec": {k: v for k, v in spec["spec"].items() if k != "diverge"}}
    with pytest.raises(EdgeFoldError, match="NaN or Inf"):
        run_job(benchmark, tmp_path)
    order = candidates(chain)
    reference = reference_values(chain, [c.name for c in order], np.load(images)[:3], 2)
    search = bisect(order, _in_process_probe(monkeypatch, tmp_path, chain, images, reference, []), 2)
    document = search.document()
    assert document["first_parting"]["name"] == "conv4" and document["first_parting"]["relative_error"] is None


def test_an_engine_that_agrees_is_answered_in_one_job(monkeypatch, tmp_path, chain, images):
    from pipeline.deploy.diverge import answer_text, bisect, candidates, reference_values

    trt_standin.install(monkeypatch, "10.3.0")
    order = candidates(chain)
    reference = reference_values(chain, [c.name for c in order], np.load(images)[:3], 2)
    jobs: list = []
    search = bisect(order, _in_process_probe(monkeypatch, tmp_path, chain, images, reference, jobs), 2)
    assert search.first is None and len(jobs) == 1
    text = answer_text({"rung": "student_int8", "device": "orin", "images": 3, **search.document()})
    assert "agrees with ONNX Runtime's on 3 images" in text and "1 debug job" in text


def test_a_tensor_not_in_the_graph_fails_the_job_naming_the_near_ones(monkeypatch, tmp_path, chain, images):
    """Before any engine is built: the name, and the names it may have meant."""
    from device.jobs.jobrun import run_job
    from device.jobs.marked import TensorNotFoundError

    trt_standin.install(monkeypatch, "10.3.0")
    with pytest.raises(TensorNotFoundError, match=r"'relu77' \(did you mean 'relu7'"):
        run_job(_debug_job(chain, images, ["relu77"], tmp_path), tmp_path)
    with pytest.raises(TensorNotFoundError, match="not written by any node"):
        run_job(_debug_job(chain, images, ["nowhere"], tmp_path, runtime="onnxruntime"), tmp_path)


def test_a_job_over_its_byte_limit_is_refused_with_the_fix(monkeypatch, tmp_path, chain, images):
    from device.jobs.debug_tensors import DivergeTooLargeError
    from device.jobs.jobrun import run_job

    trt_standin.install(monkeypatch, "10.3.0")
    with pytest.raises(DivergeTooLargeError, match="over the job's max_bytes 1000.*") as err:
        run_job(_debug_job(chain, images, ["conv0", "conv1"], tmp_path, max_bytes=1000), tmp_path)
    assert "--chunk" in err.value.fix


def test_the_debug_engine_is_cached_apart_from_the_timed_one(monkeypatch, tmp_path, chain):
    """Marking outputs changes TensorRT's fusions: the marked engine never stands in for the timed one."""
    from device.runners.engine import EngineCache
    from device.runners.trt_settings import BuildOptions

    import hashlib
    import json

    cache = EngineCache(tmp_path)
    plain, marked = BuildOptions(precision="fp32"), BuildOptions(precision="fp32", mark_outputs=("relu3",))
    assert cache.folder("a" * 64, {"gpu": "x"}, plain) != cache.folder("a" * 64, {"gpu": "x"}, marked)
    # An engine cached before debug builds existed keeps its key (the options as they were then), but an fp32 one:
    # it was built with TF32 allowed, and is built again without it.
    def old_key(precision: str) -> str:
        before = {"precision": precision, "batch": [1, 1, 1], "workspace_mib": 1024, "dla_core": None,
                  "timing_cache": None}
        return hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:8]

    assert cache.folder("a" * 64, {"gpu": "x"}, BuildOptions(precision="fp16")).name.endswith(f"-{old_key('fp16')}")
    assert not cache.folder("a" * 64, {"gpu": "x"}, plain).name.endswith(f"-{old_key('fp32')}")


@pytest.mark.parametrize("change, message", [
    ({"evaluation": None}, "give evaluation"),
    ({"runtime": "torch"}, "runtime tensorrt or onnxruntime"),
    ({"batch_sizes": [1, 2]}, "one batch size"),
    ({"diverge": {"tensors": ["a", "a"]}}, "name each tensor once"),
    ({"diverge": {"tensors": ["a"], "images": 7}}, "more than the evaluation set's 6"),
    ({"diverge": {"tensors": ["bad\nname"]}}, "should match pattern"),
    ({"evaluation": {"artifact": "b" * 64, "images": 6, "postprocess": "segmentation"}}, "postprocess none"),
    ({"diverge": None}, "postprocess none is a debug job's"),
])
def test_the_spec_refuses_a_debug_job_that_cannot_run(change, message):
    spec = {"artifact": "a" * 64, "runtime": "tensorrt", "batch_sizes": [2],
            "evaluation": {"artifact": "b" * 64, "images": 6, "postprocess": "none"}, "diverge": {"tensors": ["relu1"]}}
    with pytest.raises(ValueError, match=message):
        JobSpec.model_validate({**spec, **change})


def test_a_real_agent_serves_a_debug_jobs_tensors_checked_by_hash(tmp_path, chain, images):
    """The agent on loopback (a real uvicorn server, its job in a child process, ONNX Runtime): the client submits a
    debug job, fetches GET /v1/jobs/{id}/tensors, checks the bytes against the result's sha256 and reads them; a
    benchmark job has no tensors to serve (404)."""
    from device.client import AgentClient
    from device.service.loopback import LoopbackAgent
    from device.schema import DivergeSpec, EvaluationSpec
    from pipeline.deploy.diverge import reference_values

    with LoopbackAgent(tmp_path / "agent") as agent, AgentClient(agent.url, agent.token) as client:
        model, evaluation = client.upload(chain), client.upload(images)
        spec = JobSpec(artifact=model, batch_sizes=[4], iterations=2, profile=False,
                       evaluation=EvaluationSpec(artifact=evaluation, images=6),
                       diverge=DivergeSpec(tensors=["relu2", "pool"], images=5))
        job = client.wait(client.submit(spec)["id"], timeout_s=120)
        assert job["state"] == "succeeded", job.get("error")
        values = client.tensors(job)
        expected = reference_values(chain, ["relu2", "pool"], np.load(images)[:5], 4)
        assert values["relu2"].shape == (5, 4, 8, 8) and values["pool"].shape == (5, 4, 1, 1)
        for name in ("relu2", "pool"):
            np.testing.assert_allclose(values[name], expected[name], rtol=1e-5, atol=1e-6)
        # Bytes that are not the ones the result names are refused with both hashes, never read.
        stored = tmp_path / "agent" / "jobs" / job["id"] / "tensors.npz"
        stored.write_bytes(stored.read_bytes()[:-1] + b"x")
        from device.errors import ResultError

        with pytest.raises(ResultError, match="hash to sha256 [0-9a-f]{64}, not " + job["result"]["diverge"]["sha256"]):
            client.tensors(job)
        plain = client.wait(client.submit(JobSpec(artifact=model, iterations=2, profile=False))["id"], timeout_s=120)
        from device.client import AgentError

        with pytest.raises(AgentError, match="no debug job") as err:
            client._request("GET", f"/v1/jobs/{plain['id']}/tensors")
        assert err.value.status == 404

"""The per-layer profile: the typed table, its builders, and the job's separate profiling pass.

ONNX Runtime's profiler really runs here (CPU); TensorRT's inspector JSON is given in the documented shape."""

import json

import numpy as np
import pytest

from device.client import file_sha256
from device.jobrun import run_job
from device.profile import (Profile, batch_profile, from_onnxruntime_trace, from_tensorrt, layer_precision,
                            profile_runner, type_precision)
from device.runners import make_runner
from tests.device.agent_process import tiny_onnx
from tests.device.trt_standin import qdq_classifier


@pytest.mark.parametrize("name, precision", [
    ("float", "fp32"), ("float16", "fp16"), ("int8", "int8"), ("uint8", "int8"), ("int64", "other"),
    ("Row major linear FP32", "fp32"), ("Channel major FP16 format where channel % 8 == 0", "fp16"),
    ("Channel major INT8 format where channel % 16 == 0", "int8"), ("Half", "fp16"), ("BFloat16", "bf16"),
])
def test_element_types_read_as_precisions(name, precision):
    assert type_precision(name) == precision


def test_a_layer_touching_int8_is_on_the_int8_path():
    assert layer_precision(["float", "int8"]) == "int8" and layer_precision(["float16", "float"]) == "fp16"
    assert layer_precision(["int64"]) == "other" and layer_precision([]) == "other"


def test_shares_fallbacks_and_float_left_behind():
    timings = [{"name": "conv1", "kind": "Conv", "precision": "int8", "device": "dla", "total_ms": 6.0},
               {"name": "head", "kind": "Gemm", "precision": "fp16", "device": "gpu", "total_ms": 3.0},
               {"name": "softmax", "kind": "Softmax", "precision": "fp32", "device": "gpu", "total_ms": 1.0},
               {"name": "conv1", "kind": "Conv", "precision": "int8", "device": "dla", "total_ms": 2.0}]
    table = batch_profile(4, 2, timings, requested_device="dla")
    assert [layer.name for layer in table.layers] == ["conv1", "head", "softmax"]
    assert table.total_ms == pytest.approx(6.0) and table.layers[0].time_ms == pytest.approx(4.0)
    assert sum(layer.share for layer in table.layers) == pytest.approx(1.0)
    assert table.int8_share == pytest.approx(8 / 12) and table.dla_share == pytest.approx(8 / 12)
    assert table.fallback_layers == ["head", "softmax"] and table.float_left_behind == ["head", "softmax"]
    assert table.share_by_precision == {"int8": pytest.approx(8 / 12), "fp16": pytest.approx(3 / 12),
                                        "fp32": pytest.approx(1 / 12)}
    floats = batch_profile(1, 1, timings[1:3], requested_device="gpu")
    assert floats.float_left_behind == [] and floats.dla_share is None and floats.fallback_layers == []


def test_tensorrt_inspector_json_and_profiler_times():
    """The detailed inspector JSON (trex's example engines show these keys) joined with IProfiler's times."""
    info = {"Layers": [
        {"Name": "Reformatting CopyNode for Input Tensor 0 to conv1", "LayerType": "Reformat",
         "Inputs": [{"Name": "input", "Format/Datatype": "Row major linear FP32"}],
         "Outputs": [{"Name": "r", "Format/Datatype": "Channel major INT8 format where channel % 16 == 0"}]},
        {"Name": "{ForeignNode[conv1...relu3]}", "LayerType": "DLA", "TacticName": "dla",
         "Inputs": [{"Name": "r", "Format/Datatype": "Channel major INT8 format where channel % 16 == 0"}],
         "Outputs": [{"Name": "x", "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}]},
        {"Name": "fc", "LayerType": "CaskGemmConvolution", "TacticName": "sm87_xmma_gemm_f16",
         "Inputs": [{"Name": "x", "Format/Datatype": "Channel major FP16 format where channel % 8 == 0"}],
         "Outputs": [{"Name": "y", "Format/Datatype": "Row major linear FP32"}]}]}
    times = {"Reformatting CopyNode for Input Tensor 0 to conv1": 0.2, "{ForeignNode[conv1...relu3]}": 3.0, "fc": 0.8}
    table = from_tensorrt(json.dumps(info), times, batch_size=1, iterations=2, requested_device="dla")
    assert [(l.name, l.precision, l.device) for l in table.layers] == [
        ("{ForeignNode[conv1...relu3]}", "int8", "dla"), ("fc", "fp16", "gpu"),
        ("Reformatting CopyNode for Input Tensor 0 to conv1", "int8", "gpu")]
    assert table.layers[1].tactic == "sm87_xmma_gemm_f16" and table.total_ms == pytest.approx(2.0)
    assert table.fallback_layers == ["fc", "Reformatting CopyNode for Input Tensor 0 to conv1"]
    names_only = from_tensorrt(json.dumps({"Layers": ["fc"]}), {"fc": 1.0}, 1, 1, "gpu")
    assert names_only.layers[0].precision == "other"


def test_onnxruntime_profiles_a_q_dq_model_for_real(tmp_path):
    model = qdq_classifier(tmp_path / "int8.onnx")
    with make_runner("onnxruntime", str(model), threads=1) as runner:
        table = runner.profile_batch(np.zeros((2, 3, 16, 16), np.float32), iterations=3, warmup=1)
    assert table.iterations == 3 and table.batch_size == 2 and table.total_ms > 0
    kinds = {layer.kind for layer in table.layers}
    assert {"QuantizeLinear", "DequantizeLinear"} <= kinds or "QLinearConv" in kinds
    assert 0 < table.int8_share < 1 and "head" in table.float_left_behind
    assert all(layer.device == "cpu" for layer in table.layers)
    assert not list(tmp_path.glob("*.json")), "the trace file is removed"


def test_warmup_runs_are_left_out_of_the_trace():
    def run(ts):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": 10}

    def node(ts, dur):
        return {"cat": "Node", "name": "conv_kernel_time", "ts": ts, "dur": dur,
                "args": {"op_name": "Conv", "input_type_shape": [{"float": [1, 3, 4, 4]}], "provider": "CPUExecutionProvider"}}

    events = [run(0), node(1, 5000), run(100), node(101, 1000), {**node(102, 999), "name": "conv_fence_before"}]
    table = from_onnxruntime_trace(events, batch_size=1, skip_runs=1)
    assert table.iterations == 1 and table.layers[0].time_ms == pytest.approx(1.0)


def test_a_runner_without_a_profiler_says_so():
    class Plain:
        name = "torch"

    assert profile_runner(Plain(), [1], (3, 4, 4)) == (None, "the torch runner has no per-layer profiler")

    class Broken:
        name = "tensorrt"

        def infer(self, batch):
            return batch

        def profile_batch(self, *args):
            raise RuntimeError("inspector unavailable")

    profile, note = profile_runner(Broken(), [1], (3, 4, 4))
    assert profile is None and "inspector unavailable" in note


def test_the_job_result_carries_the_profile(tmp_path):
    """device.jobrun: a separate profiling pass after the timed windows; results keep the whole table."""
    model = tiny_onnx(tmp_path / "m.onnx")
    job = {"spec": {"artifact": file_sha256(model), "runtime": "onnxruntime", "batch_sizes": [1, 4],
                    "iterations": 5, "warmup_iterations": 1, "idle_s": 0.0, "telemetry": ["host"], "threads": 1},
           "artifact_path": str(model)}
    result = run_job(job, tmp_path)
    profile = Profile.model_validate(result["profile"])
    assert profile.runtime == "onnxruntime" and [b.batch_size for b in profile.batches] == [1, 4]
    assert profile.requested_device == "cpu" and all(b.layers for b in profile.batches)
    json.dumps(result)  # travels as JSON


def test_one_preempted_iteration_does_not_make_a_layer_slow():
    """Per-layer times are medians over the pass: a shared CPU's one 8 ms stall is not the layer's cost."""
    timings = [{"name": "stem", "kind": "Conv", "precision": "fp32", "device": "cpu", "samples_ms": [0.01] * 19 + [8.0]},
               {"name": "head", "kind": "Gemm", "precision": "fp32", "device": "cpu", "samples_ms": [0.01] * 20}]
    table = batch_profile(1, 20, timings, requested_device="cpu")
    assert table.layers[0].time_ms == pytest.approx(0.01) and table.layers[0].share == pytest.approx(0.5)


def test_the_profiling_pass_fits_its_time_budget(monkeypatch):
    """A slow model gets the minimum of iterations, a fast one the full count (budget forced, no timing)."""
    import device.profile

    class Recording:
        name = "onnxruntime"

        def __init__(self):
            self.counts = []

        def infer(self, batch):
            return batch

        def profile_batch(self, batch, iterations, warmup):
            self.counts.append(iterations)
            return batch_profile(batch.shape[0], iterations, [{"name": "x", "kind": "Conv", "precision": "fp32",
                                                               "device": "cpu", "total_ms": 1.0}], "cpu")

        def profile_meta(self):
            return {"source": "test", "requested_device": "cpu"}

    runner = Recording()
    monkeypatch.setattr(device.profile, "PROFILE_BUDGET_S", 0.0)
    profile_runner(runner, [1], (3, 4, 4))
    monkeypatch.setattr(device.profile, "PROFILE_BUDGET_S", 1e9)
    profile, _ = profile_runner(runner, [2], (3, 4, 4))
    assert runner.counts == [device.profile.PROFILE_MIN_ITERATIONS, device.profile.PROFILE_ITERATIONS]
    assert Profile.model_validate(profile).batches[0].batch_size == 2

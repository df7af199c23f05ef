"""The per-layer profile: the typed table, its builders, and the job's separate profiling pass.

ONNX Runtime's profiler really runs here (CPU); TensorRT's inspector JSON is given in the documented shape."""

import json

import numpy as np
import pytest

from device.files import sha256_file
from device.jobs.jobrun import run_job
from device.jobs.profile import (BatchProfile, Profile, batch_profile, from_onnxruntime_trace, from_tensorrt,
                            int8_payoff_reasons, layer_precision, overhead_kind, profile_runner, type_precision)
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
    # ONNX Runtime's CPU provider may or may not fuse the Conv into a QLinearConv; either way its Q/DQ
    # nodes are overhead and only INT8 compute counts as INT8.
    assert {layer.kind for layer in table.layers if layer.overhead} <= {"QuantizeLinear", "DequantizeLinear"}
    assert table.overhead_share > 0 and table.int8_share == pytest.approx(
        sum(layer.share for layer in table.layers if layer.precision == "int8" and not layer.overhead))
    assert (table.int8_share > 0) == ("QLinearConv" in kinds) and "head" in table.float_left_behind
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
    """device.jobs.jobrun: a separate profiling pass after the timed windows; results keep the whole table."""
    model = tiny_onnx(tmp_path / "m.onnx")
    job = {"spec": {"artifact": sha256_file(model), "runtime": "onnxruntime", "batch_sizes": [1, 4],
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
    import device.jobs.profile

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
    monkeypatch.setattr(device.jobs.profile, "PROFILE_BUDGET_S", 0.0)
    profile_runner(runner, [1], (3, 4, 4))
    monkeypatch.setattr(device.jobs.profile, "PROFILE_BUDGET_S", 1e9)
    profile, _ = profile_runner(runner, [2], (3, 4, 4))
    assert runner.counts == [device.jobs.profile.PROFILE_MIN_ITERATIONS, device.jobs.profile.PROFILE_ITERATIONS]
    assert Profile.model_validate(profile).batches[0].batch_size == 2


# ----------------------------------------------------------------- overhead: Q/DQ, reformat, cast
def _ort_trace(nodes):
    """A two-run ONNX Runtime trace; ``nodes`` is (name, op, input types, output types, µs per run)."""
    events = [{"cat": "Session", "name": "model_run", "ts": ts, "dur": 90} for ts in (0, 100)]
    for start in (1, 101):
        for name, op, inputs, outputs, dur in nodes:
            events.append({"cat": "Node", "name": f"{name}_kernel_time", "ts": start, "dur": dur, "args": {
                "op_name": op, "provider": "CPUExecutionProvider",
                "input_type_shape": [{t: [1, 8]} for t in inputs], "output_type_shape": [{t: [1, 8]} for t in outputs]}})
    return events


ORT_NODES = [  # what the default run's INT8 student looks like on ONNX Runtime CPU: DequantizeLinear on top
    ("dequant_w", "DequantizeLinear", ["int8", "float", "int8"], ["float"], 120),
    ("conv_q", "QLinearConv", ["uint8", "float", "uint8", "int8"], ["uint8"], 410),
    ("quant_in", "QuantizeLinear", ["float", "float", "uint8"], ["uint8"], 50),
    ("dequant_out", "DequantizeLinear", ["uint8", "float", "uint8"], ["float"], 30),
    ("island_cast", "Cast", ["float"], ["float16"], 2),
    ("head", "Gemm", ["float", "float"], ["float"], 388),
]


def test_q_dq_and_cast_nodes_are_overhead_not_int8_compute():
    """DequantizeLinear touches INT8 but computes nothing; it used to count as an INT8 layer."""
    table = from_onnxruntime_trace(_ort_trace(ORT_NODES), batch_size=1)
    overhead = {layer.name: layer.overhead for layer in table.layers}
    assert overhead == {"dequant_w": "qdq", "conv_q": None, "quant_in": "qdq", "dequant_out": "qdq",
                        "island_cast": "cast", "head": None}
    assert table.layers[2].name == "dequant_w" and table.layers[2].precision == "int8"  # its precision stays
    assert table.int8_share == pytest.approx(0.410) and table.overhead_share == pytest.approx(0.202)
    assert table.share_by_precision["int8"] == pytest.approx(0.610)  # per precision, every layer still counts
    assert table.float_left_behind == ["head"]  # a Cast is overhead, not a float layer left behind


def test_tensorrt_reformats_unfused_q_dq_and_casts_are_overhead():
    """Inspector names as TensorRT writes them; fused layers and Myelin subgraphs that mention a Q/DQ compute."""
    def layer(name, kind, fmt_in, fmt_out, tactic="sm87_kernel"):
        return {"Name": name, "LayerType": kind, "TacticName": tactic,
                "Inputs": [{"Name": "i", "Format/Datatype": fmt_in}], "Outputs": [{"Name": "o", "Format/Datatype": fmt_out}]}

    int8, fp16, fp32 = "Channel major INT8 format where channel % 16 == 0", "Half", "Row major linear FP32"
    info = {"Layers": [
        layer("Reformatting CopyNode for Input Tensor 0 to conv1 + relu1", "Reformat", fp32, int8),
        layer("conv1 + relu1", "CaskConvolution", int8, int8),
        layer("QuantizeLinear_7_quantize_scale_node", "Scale", fp16, int8),
        layer("conv2 + DequantizeLinear_9", "CaskConvolution", int8, int8),
        layer("head reformatted input 0", "NoOp", int8, fp16),
        layer("/head/Cast", "Cast", fp16, fp32),
        layer("{ForeignNode[QuantizeLinear_11...Gemm_20]}", "Myelin", fp16, fp16)]}
    times = {"Reformatting CopyNode for Input Tensor 0 to conv1 + relu1": 0.5, "conv1 + relu1": 2.0,
             "QuantizeLinear_7_quantize_scale_node": 0.5, "conv2 + DequantizeLinear_9": 2.0,
             "head reformatted input 0": 0.5, "/head/Cast": 0.5, "{ForeignNode[QuantizeLinear_11...Gemm_20]}": 4.0}
    table = from_tensorrt(json.dumps(info), times, batch_size=1, iterations=1, requested_device="gpu")
    assert {layer.name: layer.overhead for layer in table.layers if layer.overhead} == {
        "Reformatting CopyNode for Input Tensor 0 to conv1 + relu1": "reformat",
        "QuantizeLinear_7_quantize_scale_node": "qdq", "head reformatted input 0": "reformat", "/head/Cast": "cast"}
    assert table.int8_share == pytest.approx(0.4) and table.overhead_share == pytest.approx(0.2)
    assert table.float_left_behind == ["{ForeignNode[QuantizeLinear_11...Gemm_20]}"]
    reasons = int8_payoff_reasons(table)
    assert len(reasons) == 3, reasons
    assert reasons[0].startswith("Q/DQ, reformat and cast layers take 20% of the time") and "--dumpLayerInfo" in reasons[0]
    assert "1 Q/DQ layer(s) run as layers of their own" in reasons[1]
    assert "QuantizeLinear_7_quantize_scale_node (Scale, 5%)" in reasons[1] and "TensorRT fuses" in reasons[1]
    assert reasons[2].startswith("Float layers take 40% of the time") and "lint.float_layers" in reasons[2]


def test_dla_transfers_stay_dla_io_not_overhead():
    info = {"Layers": [{"Name": "{ForeignNode[conv1...relu3]}", "LayerType": "DLA", "TacticName": "dla",
                        "Inputs": [{"Name": "i", "Format/Datatype": "Channel major INT8 format"}], "Outputs": []}]}
    table = from_tensorrt(json.dumps(info), {"{ForeignNode[conv1...relu3]}": 3.0, "images to nvm": 1.0},
                          batch_size=1, iterations=1, requested_device="dla")
    transfer = next(layer for layer in table.layers if layer.kind == "DLA transfer")
    assert transfer.overhead is None and table.overhead_share == 0 and table.dla_share == pytest.approx(1.0)


@pytest.mark.parametrize("kind, name, expected", [
    ("DequantizeLinear", "anything", "qdq"), ("QuantizeLinear", "q", "qdq"), ("Cast", "c", "cast"),
    ("Reformat", "r", "reformat"), ("ReorderInput", "nchwc", "reformat"), ("Conv", "conv", None),
    ("Scale", "DequantizeLinear_4_dequantize_scale_node", "qdq"), ("CaskConvolution", "conv + QuantizeLinear_2", None),
    ("Myelin", "{ForeignNode[DequantizeLinear_0...Relu_9]}", None), ("ElementWise", "broadcast_add", None),
])
def test_overhead_kind(kind, name, expected):
    assert overhead_kind(kind, name) == expected


def test_a_stored_profile_without_the_overhead_fields_still_validates_and_is_split():
    """Results stored before the split carry int8_share with the Q/DQ counted: re-read, they are split."""
    table = from_onnxruntime_trace(_ort_trace(ORT_NODES), batch_size=1).model_dump()
    old = {**{k: v for k, v in table.items() if k != "overhead_share"}, "int8_share": 0.610,
           "float_left_behind": ["head", "island_cast"],
           "layers": [{k: v for k, v in layer.items() if k != "overhead"} for layer in table["layers"]]}
    again = BatchProfile.model_validate(old)
    assert again.int8_share == pytest.approx(0.410) and again.overhead_share == pytest.approx(0.202)
    assert again.float_left_behind == ["head"] and again.layers[0].overhead is None
    assert Profile.model_validate({"runtime": "onnxruntime", "source": "old", "requested_device": "cpu",
                                   "batches": [old]}).batches[0].int8_share == pytest.approx(0.410)


def test_int8_payoff_reasons_on_onnxruntime():
    table = from_onnxruntime_trace(_ort_trace(ORT_NODES), batch_size=1)
    reasons = int8_payoff_reasons(table)
    assert reasons[0].startswith("Q/DQ, reformat and cast layers take 20% of the time (dequant_w (DequantizeLinear, 12%)")
    assert "3 Q/DQ layer(s) run as layers of their own" in reasons[1] and "QLinear*" in reasons[1]
    assert reasons[2].startswith("Float layers take 39% of the time in an INT8 model: head (Gemm, 39%)")
    fake = from_onnxruntime_trace(_ort_trace([n for n in ORT_NODES if n[0] != "conv_q"]), batch_size=1)
    assert any(r.startswith("No compute layer ran in INT8") for r in int8_payoff_reasons(fake))


def test_no_reasons_for_a_float_model_or_a_clean_int8_engine():
    floats = batch_profile(1, 1, [{"name": "conv", "kind": "Conv", "precision": "fp32", "device": "cpu",
                                   "total_ms": 1.0}], "cpu")
    assert int8_payoff_reasons(floats) == []
    clean = batch_profile(1, 1, [
        {"name": "conv1 + relu1", "kind": "CaskConvolution", "precision": "int8", "device": "gpu", "total_ms": 9.0,
         "tactic": "sm87_int8"},
        {"name": "Reformatting CopyNode for Input Tensor 0 to conv1 + relu1", "kind": "Reformat",
         "precision": "int8", "device": "gpu", "total_ms": 1.0, "tactic": "copy"}], "gpu")
    assert clean.overhead_share == pytest.approx(0.1) and int8_payoff_reasons(clean) == []


def test_an_unfused_q_dq_is_known_by_its_origin_and_a_dangling_one_by_its_scale_layer():
    """TensorRT's inspector reports an unfused Q/DQ as a Reformat whose Origin is QDQ (trex's example engines,
    trex graphing.py at v10.16) and a dangling one as a Scale with INT8 on one side only (trex lint.py): both
    are Q/DQ overhead, so the verdict's "unfused Q/DQ" and "no INT8 compute" reasons can fire on TensorRT."""
    int8, fp16 = "Channel major INT8 format where channel % 16 == 0", "Channel major FP16 format where channel % 8 == 0"

    def layer(name, kind, fmt_in, fmt_out, **extra):
        return {"Name": name, "LayerType": kind, "TacticName": "t", **extra,
                "Inputs": [{"Name": "i", "Format/Datatype": fmt_in}], "Outputs": [{"Name": "o", "Format/Datatype": fmt_out}]}

    info = {"Layers": [layer("quant_input", "Reformat", fp16, int8, Origin="QDQ"),
                       layer("input reformatter", "Reformat", fp16, fp16, Origin="REFORMAT"),
                       layer("dq_head", "Scale", int8, fp16),
                       layer("bias_scale", "Scale", fp16, fp16),
                       layer("conv1 + relu1", "CaskConvolution", fp16, fp16)]}
    times = {"quant_input": 1.0, "input reformatter": 1.0, "dq_head": 1.0, "bias_scale": 1.0, "conv1 + relu1": 6.0}
    table = from_tensorrt(json.dumps(info), times, batch_size=1, iterations=1, requested_device="gpu")
    kinds = {layer.name: layer.overhead for layer in table.layers}
    assert kinds == {"quant_input": "qdq", "input reformatter": "reformat", "dq_head": "qdq", "bias_scale": None,
                     "conv1 + relu1": None}
    reasons = " ".join(int8_payoff_reasons(table))
    assert "2 Q/DQ layer(s) run as layers of their own" in reasons and "quant_input (Reformat" in reasons
    assert "No compute layer ran in INT8" in reasons and "TensorRT built no INT8 kernel" in reasons


def test_dla_layers_come_from_the_builds_record_not_from_a_guessed_layer_type():
    """The inspector's JSON for a DLA subgraph is documented by no source read: the build's record of what
    can_run_on_DLA accepted and refused decides. A DLA subgraph is a ForeignNode over accepted layers (its ends may
    be the parser's Q/DQ, which the record leaves out); a ForeignNode over refused layers (Myelin on the GPU) and a
    fused kernel (TensorRT moves accepted layers to the GPU past the DLA's subgraph limit) are GPU time."""
    fmt = "Channel major INT8 format where channel % 16 == 0"
    names = ("{ForeignNode[conv1...relu3]}", "{ForeignNode[quant_input...relu2]}", "{ForeignNode[Flatten_0...Gemm_1]}",
             "conv4 + relu4")
    info = {"Layers": [{"Name": name, "LayerType": "Unknown", "Inputs": [{"Name": "i", "Format/Datatype": fmt}],
                        "Outputs": []} for name in names]}
    times = dict(zip(names, (3.0, 2.0, 1.0, 1.0)))
    accepted = ["conv1", "relu1", "conv2", "relu2", "conv3", "relu3", "conv4", "relu4"]
    refused = ["Flatten_0", "Gemm_1"]
    table = from_tensorrt(json.dumps(info), times, 1, 1, "dla", dla_layers=accepted, dla_refused=refused)
    assert {layer.name: layer.device for layer in table.layers} == dict(zip(names, ("dla", "dla", "gpu", "gpu")))
    assert set(table.fallback_layers) == {names[2], names[3]} and table.dla_share == pytest.approx(5 / 7)
    # A GPU build is never on the DLA, whatever it names.
    assert all(layer.device == "gpu" for layer in from_tensorrt(json.dumps(info), times, 1, 1, "gpu", accepted).layers)

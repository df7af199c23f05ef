"""The report's "Where the time goes" section, from the agents' per-layer profiles (device.jobs.profile)."""

from device.jobs.profile import Profile, batch_profile
from device.schema import parse_result
from pipeline.report.profile_report import time_section
from pipeline.tasks.classification.report_data import layer_profiles
from pipeline.report.sections import to_html_fragment, to_markdown_lines


def time_section_markdown(data):
    return to_markdown_lines(time_section(data))


def time_section_html(data):
    return to_html_fragment(time_section(data))
from tests.results import job_result


def _result(profile):
    return {"state": "succeeded", "result": parse_result(job_result(profile=profile))}


def test_top_layers_int8_share_fallbacks_and_float_left_behind():
    timings = [{"name": "{ForeignNode[conv1...relu3]}", "kind": "DLA", "precision": "int8", "device": "dla",
                "total_ms": 6.0},
               {"name": "fc", "kind": "CaskGemmConvolution", "precision": "fp16", "device": "gpu", "total_ms": 3.0},
               {"name": "softmax", "kind": "Softmax", "precision": "fp32", "device": "gpu", "total_ms": 1.0}]
    tables = [batch_profile(b, 1, timings, "dla") for b in (8, 1)]
    profile = Profile(runtime="tensorrt", source="test", requested_device="dla", batches=tables).model_dump()
    devices = [{"name": "orin", "rungs": {"student_int8": _result(profile),
                                          "teacher": {"state": "succeeded", "result": parse_result(job_result(
                                              runtime="torch", precision="fp32",
                                              profile_note="the torch runner has no per-layer profiler"))},
                                          "pruned": {"state": "failed"}}}]
    entries = layer_profiles(devices)
    assert [(e["rung"], e["status"]) for e in entries] == [("student_int8", "measured"), ("teacher", "not measured")]
    assert entries[0]["profile"]["batches"][0]["layers"][0]["name"] == "{ForeignNode[conv1...relu3]}"
    text = "\n".join(time_section_markdown({"layer_profiles": entries}))
    assert "## Where the time goes" in text and "### student_int8 on orin (tensorrt, dla, batch 1)" in text
    assert ("INT8 compute takes 60.0% of the time, Q/DQ/reformat/cast overhead 0.0%, float layers 40.0% "
            "(fp16 30.0%, fp32 10.0%)." in text and "Biggest layer left in float: fc" in text)
    assert "Why INT8 may not pay off" in text  # the float layers take 40%
    assert "2 layer(s) fell back to the GPU: fc, softmax" in text and "| fc | CaskGemmConvolution | fp16 | gpu (fell back)" in text
    assert "not measured: the torch runner has no per-layer profiler" in text
    assert "<h2>Where the time goes</h2>" in time_section_html({"layer_profiles": entries})


def _student_on(runtime, timings, device="cpu"):
    profile = Profile(runtime=runtime, source="test", requested_device=device,
                      batches=[batch_profile(1, 1, timings, device)]).model_dump()
    return [{"device": "loopback", "rung": "student_int8", "runtime": runtime, "status": "measured", "reason": None,
             "profile": profile}]


DEFAULT_RUN = [  # the default run's INT8 student on ONNX Runtime CPU: Q/DQ nodes among its slowest layers
    {"name": "dequant_w", "kind": "DequantizeLinear", "precision": "int8", "device": "cpu", "total_ms": 12.0},
    {"name": "conv_q", "kind": "QLinearConv", "precision": "int8", "device": "cpu", "total_ms": 41.0},
    {"name": "quant_in", "kind": "QuantizeLinear", "precision": "int8", "device": "cpu", "total_ms": 8.0},
    {"name": "island_cast", "kind": "Cast", "precision": "fp16", "device": "cpu", "total_ms": 0.2},
    {"name": "head", "kind": "Gemm", "precision": "fp32", "device": "cpu", "total_ms": 38.8}]


def test_q_dq_reformat_and_cast_time_is_overhead_not_int8():
    """The summary splits INT8 compute from the Q/DQ/reformat/cast overhead; the table marks it."""
    entries = _student_on("onnxruntime", DEFAULT_RUN)
    text = "\n".join(time_section_markdown({"layer_profiles": entries}))
    assert ("INT8 compute takes 41.0% of the time, Q/DQ/reformat/cast overhead 20.2%, float layers 38.8% "
            "(fp32 38.8%)." in text)
    assert "| dequant_w | DequantizeLinear | int8 (Q/DQ overhead) | cpu |" in text
    assert "| island_cast | Cast | fp16 (cast overhead) | cpu |" in text and "| conv_q | QLinearConv | int8 | cpu |" in text
    assert "- Q/DQ, reformat and cast layers take 20% of the time" in text
    assert "Biggest layer left in float: head" in text
    page = time_section_html({"layer_profiles": entries})
    assert "<li>Q/DQ, reformat and cast layers take 20% of the time" in page and "int8 (Q/DQ overhead)" in page


def test_a_stored_profile_from_before_the_split_reads_the_same():
    entries = _student_on("onnxruntime", DEFAULT_RUN)
    table = entries[0]["profile"]["batches"][0]
    table.pop("overhead_share")
    table["int8_share"] = 0.61  # as stored then: the Q/DQ counted as INT8
    for layer in table["layers"]:
        layer.pop("overhead")
    text = "\n".join(time_section_markdown({"layer_profiles": entries}))
    assert "INT8 compute takes 41.0% of the time, Q/DQ/reformat/cast overhead 20.2%" in text
    assert "int8 (Q/DQ overhead)" in text


def test_only_q_dq_in_int8_says_no_compute_ran_in_int8():
    fake = [t for t in DEFAULT_RUN if t["name"] != "conv_q"] + [
        {"name": "conv", "kind": "FusedConv", "precision": "fp32", "device": "cpu", "total_ms": 41.0}]
    text = "\n".join(time_section_markdown({"layer_profiles": _student_on("onnxruntime", fake)}))
    assert "INT8 compute takes 0.0% of the time" in text and "No compute layer ran in INT8: only its Q/DQ did." in text
    assert "No INT8 layers: the model runs in float." not in text

"""The report's "Where the time goes" section, from the agents' per-layer profiles (device.profile)."""

from device.profile import Profile, batch_profile
from device.schema import parse_result
from pipeline.report import layer_profiles, time_section_html, time_section_markdown
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
    assert "INT8 layers take 60.0% of the time" in text and "Biggest layer left in float: fc" in text
    assert "2 layer(s) fell back to the GPU: fc, softmax" in text and "| fc | CaskGemmConvolution | fp16 | gpu (fell back)" in text
    assert "not measured: the torch runner has no per-layer profiler" in text
    assert "<h2>Where the time goes</h2>" in time_section_html({"layer_profiles": entries})

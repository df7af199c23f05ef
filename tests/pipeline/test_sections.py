"""The report's one page model (:mod:`pipeline.report.sections`): the headline every task opens its page with."""

from __future__ import annotations

from pipeline.report.sections import Headline, Section, Text, page_title, to_html, to_markdown

HEADLINE = Headline("student INT8 on orin vs teacher FP32 on dc", [
    ("INT8 rung", "not measured as INT8 on orin: no compute layer ran in INT8"), ("", "measure it with EDGE=…"),
    ("top-1", "98.10% vs 98.40%  (0.30 points lost | <b>within noise</b>)"),
    (None, "note: the teacher rung's numbers come from orin")])


def test_the_headline_prints_as_aligned_lines_under_its_title():
    assert HEADLINE.lines().splitlines() == [
        "student INT8 on orin vs teacher FP32 on dc",
        "  INT8 rung      not measured as INT8 on orin: no compute layer ran in INT8",
        "                 measure it with EDGE=…",
        "  top-1          98.10% vs 98.40%  (0.30 points lost | <b>within noise</b>)",
        "  note: the teacher rung's numbers come from orin"]


def test_the_headline_is_a_table_in_both_formats_its_text_escaped():
    sections = [Section("Headline", [Text("Generated now."), HEADLINE]), Section("The ladder", [Text("…")])]
    markdown = to_markdown(page_title("tiny", "r1"), sections)
    assert markdown.startswith("# EdgeFold report: tiny / r1\n\n## Headline\n\nGenerated now.\n\n"
                               "**student INT8 on orin vs teacher FP32 on dc**\n\n| | |\n|---|---|\n"
                               "| INT8 rung | not measured as INT8 on orin: no compute layer ran in INT8 |\n"
                               "|  | measure it with EDGE=… |\n")
    assert r"| top-1 | 98.10% vs 98.40%  (0.30 points lost \| &lt;b>within noise&lt;/b>) |" in markdown
    page = to_html(page_title("tiny", "r1"), sections)
    assert page.index('<table class="headline"><caption>student INT8 on orin vs teacher FP32 on dc</caption>') < \
        page.index("The ladder")
    assert '<tr><th scope="row">top-1</th><td>98.10% vs 98.40%  (0.30 points lost | &lt;b&gt;within noise' in page
    assert '<tr><th scope="row"></th><td>note: the teacher' in page and "<b>" not in page


def test_every_task_heads_its_page_alike():
    from pipeline.tasks.classification.headline import block as classification_headline
    from pipeline.tasks.detection.report import headline_block as detection_headline

    unmeasured = classification_headline({"status": "not measured", "reason": "no deploy stage",
                                          "runtime_fallbacks": {"loopback": "no tensorrt"}})
    assert unmeasured == Headline("headline: not measured (no deploy stage)", [("runtime", "on loopback: no tensorrt")])
    assert detection_headline({"rung": "student_int8", "measured": False, "reason": "the agent was unreachable"}) == \
        Headline("student_int8: not measured on any device", [("why", "the agent was unreachable")])
    measured = detection_headline({"rung": "student_int8", "measured": True, "device": "orin", "runtime": "tensorrt",
                                   "map": 0.2, "map_low": 0.18, "map_high": 0.22, "map_vs_student_points": -0.4,
                                   "latency_p50_ms": 1.5, "latency_batch": 1, "ratio_vs_student": 0.5,
                                   "ratio_low": 0.45, "ratio_high": 0.55, "ratio_significant": True,
                                   "postprocess_ms_per_image": 0.3, "method": "max", "box_head": "fp16"})
    # A result without the teacher measured: the network's own figure and its ratio to the FP32 student.
    assert [label for label, _ in measured.rows] == ["mAP", "latency p50", "vs FP32 student", "decode + NMS", "INT8"]
    assert dict(measured.rows)["latency p50"] == "network 1.500 ms at batch 1"
    assert dict(measured.rows)["vs FP32 student"] == "network ×0.50 [0.45, 0.55] the FP32 student's (faster)"


def _teacher_and_student_rows():
    """One edge and one data-center device's flat rows, windows per round, as every task's report holds them."""
    common = {"status": "measured", "reason": None, "runtime": "tensorrt", "latency_batch": 1}
    student = {**common, "rung": "student_int8", "device": "orin", "role": "edge", "precision": "int8",
               "latency_p50_ms": 2.0, "latency_p50_windows_ms": [2.0, 2.1, 1.9], "throughput_images_per_s": 900.0,
               "throughput_windows": [900.0, 880.0, 910.0], "energy_mj_per_image": 3.0,
               "energy_windows_mj": [3.0, 3.1, 2.9], "peak_memory_mb": 300.0, "size_mb": 1.0, "macs_g": 0.5,
               "params_m": 2.0}
    teacher = {**common, "rung": "teacher", "device": "dc", "role": "dc", "precision": "fp32",
               "latency_p50_ms": 1.0, "latency_p50_windows_ms": [1.0, 1.0, 1.0], "throughput_images_per_s": 3000.0,
               "throughput_windows": [3000.0, 3100.0, 2900.0], "energy_mj_per_image": None,
               "energy_windows_mj": [None, None, None], "peak_memory_mb": 900.0, "size_mb": 10.0, "macs_g": 4.0,
               "params_m": 20.0}
    fp32 = {**student, "rung": "student", "precision": "fp32", "size_mb": 4.0}
    return student, teacher, fp32


def test_every_task_compares_its_lead_with_the_teacher_on_the_dc_device_in_the_same_words():
    """Classification's, detection's and segmentation's headlines hold the same comparison (pipeline.report.headline):
    latency, throughput, energy, compute and size of the lead on the edge against the teacher on the dc device."""
    from pipeline.report.headline import edge_vs_dc
    from pipeline.tasks.classification.headline import block as classification_headline
    from pipeline.tasks.detection.report import headline as detection_data
    from pipeline.tasks.detection.report import headline_block as detection_headline
    from pipeline.tasks.segmentation.report import headline as segmentation_data
    from pipeline.tasks.segmentation.report import headline_block as segmentation_headline

    student, teacher, fp32 = _teacher_and_student_rows()
    scored = {"map": 0.3, "map_low": 0.28, "map_high": 0.32, "miou": 0.6, "miou_low": 0.58, "miou_high": 0.62}
    rows = [{**row, **scored} for row in (student, teacher, fp32)]
    classification = classification_headline({
        "status": "measured", "edge_device": "orin", "dc_device": "dc", "top1_edge": 0.9, "top1_dc": 0.92,
        "accuracy_lost_points": 2.0, "edge_precision": "int8", "dc_precision": "fp32", "size_mb_student_fp32": 4.0,
        **edge_vs_dc(student, teacher)})
    detection = detection_headline(detection_data(rows, {"method": "max", "box_head": "fp16"}))
    segmentation = segmentation_headline(segmentation_data(rows, {"method": "max"}))
    assert classification.title == "student INT8 on orin vs teacher FP32 on dc"
    assert detection.title == segmentation.title == "student_int8 on orin (tensorrt) vs teacher FP32 on dc"
    shared = ("latency p50", "throughput", "energy/image", "compute", "size, FP32")
    for headline in (classification, detection, segmentation):
        found = dict(headline.rows)
        assert [found[label] for label in shared] == [dict(classification.rows)[label] for label in shared]
    found = dict(detection.rows)
    assert found["latency p50"].startswith("2.000 ms vs 1.000 ms  (2.00× slower, ×2.00 [")
    assert found["throughput"].startswith("900 vs 3000 images/s  (3.33× lower")
    assert found["energy/image"] == "3.00 vs not measured mJ", "one side unmeasured: no ratio"
    assert found["compute"] == "12.5% of the teacher's MACs, 10.0% of its parameters (smaller)"
    assert found["size, FP32"] == "4.0 MB vs 10.0 MB  (2.50× smaller); deployed INT8 1.0 MB"
    assert found["mAP"] == ("30.0 [28.0, 32.0] on the device; the teacher's on dc: 30.0 [28.0, 32.0] (+0.00 points)")
    assert dict(segmentation.rows)["mIoU"].startswith("60.0 [58.0, 62.0] on the device; the teacher's on dc")


def test_without_a_dc_device_the_teacher_on_the_edge_is_the_baseline_and_the_headline_says_so():
    from pipeline.tasks.detection.report import headline, headline_block

    student, teacher, fp32 = _teacher_and_student_rows()
    teacher = {**teacher, "device": "orin", "role": "edge"}
    rows = [{**row, "map": 0.3} for row in (student, teacher, fp32)]
    block = headline_block(headline(rows, {}))
    assert block.title.endswith("vs teacher FP32 on orin")
    assert dict(block.rows)["note"] == ("no data-center device measured the teacher (DC=): its numbers come from the "
                                        "same device, orin")

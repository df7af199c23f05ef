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
    assert [label for label, _ in measured.rows] == ["mAP", "latency p50", "decode + NMS", "INT8"]
    assert dict(measured.rows)["latency p50"] == ("network 1.500 ms at batch 1, ×0.50 [0.45, 0.55] the FP32 "
                                                 "student's (faster)")

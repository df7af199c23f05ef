"""The detection ladder's report section: mAP per rung (host and device, with intervals), what quantizing the box
head costs, the network's and the post-processing's time apart, and the INT8 fold's per-class changes."""

from __future__ import annotations

from typing import Any


def _ap(scores: dict[str, Any] | None) -> str:
    if not scores or scores.get("map") is None:
        return "—"
    low, high = scores.get("map_low"), scores.get("map_high")
    interval = f" [{100 * low:.1f}, {100 * high:.1f}]" if low is not None and high is not None else ""
    return f"{100 * scores['map']:.1f}{interval}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def render(name: str, ladder: dict[str, Any], deploy: dict[str, Any], quantize: dict[str, Any]) -> str:
    """The Markdown section.

    Args:
        name: The recipe's name.
        ladder: The evaluate stage's ``ladder.json``.
        deploy: The deploy stage's ``results.json``.
        quantize: The quantize stage's metrics.
    """
    lines = [f"# {name}: detection ladder", ""]
    for device in deploy["devices"]:
        runtime = device.get("runtime") or "—"
        lines += [f"## {device['name']} ({runtime}; {device['status']})", ""]
        if device.get("runtime_fallback"):
            lines += [f"> {device['runtime_fallback']}", ""]
        if device.get("error"):
            lines += [f"> not measured: {device['error']}", ""]
        lines += ["| rung | precision | box head | host mAP [95% CI] | device mAP [95% CI] | AP50 (device) | size MB "
                  "| network p50 ms (batch) | network ms/img (eval) | decode + NMS ms/img |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for rung, row in ladder["rungs"].items():
            measured = device["rungs"].get(rung, {})
            ok = measured.get("state") == "succeeded"
            p50 = ", ".join(f"{v:.2f} ({b})" for b, v in measured.get("latency_p50_ms", {}).items()) if ok else \
                measured.get("state", "not measured")
            ap50 = f"{100 * measured['scores']['ap50']:.1f}" if ok else "—"
            lines.append(f"| {rung} | {row['precision']} | {row.get('box_head', '—')} | {_ap(row)} | "
                         f"{_ap(measured.get('scores')) if ok else '—'} | {ap50} | {row['size_mb']:.2f} | {p50} | "
                         f"{_ms(measured.get('network_ms_per_image'))} | "
                         f"{_ms(measured.get('postprocess_ms_per_image'))} |")
        lines.append("")
    lines += [f"Images scored on the device: {deploy['images']}. Host mAP: the teacher through torchvision's "
              "post-processing, the others through ONNX Runtime and the device's decode + NMS "
              "(device/detection_post.py); device mAP: the engine that was timed, decoded on the device.", ""]
    others = quantize.get("other_box_heads")
    if others:
        lines += [f"Quantizing the box head: against the FP32 student, INT8 with the box head {quantize['box_head']} "
                  f"changes mAP by {-quantize['drop_points']:+.2f} points, "
                  + ", ".join(f"with it {o['box_head']} by {-o['drop_points']:+.2f}" for o in others)
                  + f" (host, {quantize['method']} calibration).", ""]
    rows = quantize.get("class_changes_vs_fp32") or []
    if rows:
        lines += ["## INT8 fold, per class (AP change in points, paired bootstrap 95% CI, Holm-corrected)", "",
                  "| class | boxes | AP FP32 | AP INT8 | change | 95% CI | p (Holm) |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            mark = " *" if r["significant"] else ""
            lines.append(f"| {r['class']} | {r['boxes']} | {100 * r['ap_before']:.1f} | {100 * r['ap_after']:.1f} | "
                         f"{r['change_points']:+.2f}{mark} | [{r['change_low']:+.2f}, {r['change_high']:+.2f}] | "
                         f"{r['p_holm']:.3f} |")
        lines.append("")
    return "\n".join(lines)

"""The headline: one object (the report's ``headline``, in results.json and the manifest) and every view of it.

The console line of ``make edge``, the headline table that opens report.md and report.html, and ``edgefold
report`` all render the same dictionary with the functions here, so they cannot disagree: a ratio
whose 95% interval holds 1 is "no measurable difference" in each, and an accuracy change is said with
its McNemar p-value and the classes that dropped beyond noise.
"""

from __future__ import annotations

from typing import Any

from pipeline.report.headline import (NOT_MEASURED, compute_row, energy_row, significant_direction, size_row,
                                      speed_rows)
from pipeline.report.sections import Headline
from pipeline.tasks.classification.device_accuracy import CAUSES

ALPHA = 0.05


def accuracy_words(h: dict[str, Any], brief: bool = False) -> str:
    """"4.38 points lost, McNemar p = 0.003: beyond noise; dropped beyond noise: 'Shirt' -25.0 points (Holm p = 0.008)"."""
    lost = h.get("accuracy_lost_points")
    if lost is None:
        return f"accuracy change {NOT_MEASURED}"
    change = "no change" if not lost else f"{lost:.2f} points lost" if lost > 0 else f"{-lost:.2f} points gained"
    p = h.get("accuracy_p")
    if p is not None and lost:
        change += (f", McNemar p = {p:.2g}: " + ("beyond noise" if p < ALPHA else "within noise")) if not brief \
            else ("" if p < ALPHA else " (within noise)")
    drops = h.get("significant_class_drops") or []
    if drops:
        named = [f"{d['class']!r} {d['change_points']:+.1f} points" + ("" if brief else f" (Holm p = {d['p_holm']:.2g})")
                 for d in drops]
        change += "; dropped beyond noise: " + ", ".join(named)
    elif h.get("per_class_tested") and not brief:
        change += "; no class dropped beyond noise"
    return change


def one_line(h: dict[str, Any]) -> str:
    """The report stage's console line."""
    if h["status"] != "measured":
        return f"headline {NOT_MEASURED} ({h['reason']})"
    return (f"student {h.get('edge_precision', 'int8').upper()} on {h['edge_device']}: {accuracy_words(h, brief=True)}; "
            f"latency {significant_direction(h, 'latency', 'faster', 'slower', brief=True)} vs the "
            f"{h.get('baseline_label', 'teacher')} on "
            f"{h['dc_device']}")


def text(h: dict[str, Any]) -> str:
    """The headline as a few aligned lines (printed by ``make edge`` and ``edgefold report``)."""
    return block(h).lines()


def block(h: dict[str, Any]) -> Headline:
    """The headline's title and findings: the report's first table, and :func:`text`'s lines."""
    fallbacks = [("runtime", f"on {device}: {why}") for device, why in (h.get("runtime_fallbacks") or {}).items()]
    if h["status"] != "measured":
        return Headline(f"headline: {NOT_MEASURED} ({h['reason']})", fallbacks)
    edge, dc = h.get("edge_precision", "int8").upper(), h.get("dc_precision", "fp32").upper()
    against = h.get("baseline_label", "teacher")  # an ONNX start's: the given model
    rows: list[tuple[str | None, str]] = [
        *int8_not_measured_rows(h),
        ("top-1", f"{100 * h['top1_edge']:.2f}% vs {100 * h['top1_dc']:.2f}%  ({accuracy_words(h)})"),
        *speed_rows(h)]
    if h.get("frame_text"):  # deploy.frame: the camera application's figure beside the network's
        rows.append(("frame", h["frame_text"]))
    if h.get("sustained_text"):  # deploy.sustained: the latency a warm board settles at, when measurably worse
        rows.append(("sustained", h["sustained_text"]))
    rows.append(energy_row(h))
    if against == "teacher":  # an ONNX start's INT8 is the given network
        rows += compute_row(h, against)
    rows.append(size_row(h, edge, dc))
    if h.get("teacher_precision_why"):
        rows.append((f"{'teacher' if against == 'teacher' else 'baseline'} as", h["teacher_precision_why"]))
    for d in h.get("device_deviations") or []:
        rows.append(("device top-1", f"{d['rung']} on {d['device']}: {100 * d['device_top1']:.2f}% on the device vs "
                                     f"{100 * d['host_top1']:.2f}% on the host (same {d['images']} images, McNemar "
                                     f"p = {d['mcnemar_p']:.2g}): differs by more than noise; {CAUSES}"))
        rows.append(("where it parts", d["diverge"]) if d.get("diverge") else
                    ("where it parts", f"not searched yet: edgefold diverge RUN --rung {d['rung'].split(' ')[0]} "
                                       f"--device {d['device']} finds the first layer whose values part from ONNX "
                                       "Runtime's"))
    rows += [(None, int8_vs_fp16_text(v)) for v in h.get("int8_vs_fp16") or []]
    rows += [(None, two_roads_text(v)) for v in h.get("two_roads") or []]
    rows += [("power mode", f"{c['rung']} on {c['device']}: {c['text']}") for c in h.get("power_mode_choices") or []]
    rows += fallbacks
    if h.get("note"):
        rows.append(("note", h["note"]))
    return Headline(f"student {edge} on {h['edge_device']} vs {against} {dc} on {h['dc_device']}", rows)


def int8_not_measured_rows(h: dict[str, Any]) -> list[tuple[str, str]]:
    """Why the headline leads with a float rung: the device ran no INT8 compute, and how to measure INT8."""
    missing = h.get("int8_not_measured")
    if not missing:
        return []
    return [("INT8 rung", f"not measured as INT8 on {missing['device']}: {missing['reason']}"), ("", missing["fix"])]


def ratio_parts(line: dict[str, Any]) -> list[str]:
    """``×1.08 latency [1.02, 1.15]`` and ``×1.05 energy per image [...]`` from a comparison's ``latency_*`` and
    ``energy_*`` keys, each said "(no measurable difference)" when its interval holds 1, or "not measured"."""
    parts = []
    for name, words in (("latency", "latency"), ("energy", "energy per image")):
        if line.get(f"{name}_ratio") is None:
            parts.append(f"{words} {NOT_MEASURED}")
            continue
        ratio = f"×{line[f'{name}_ratio']:.2f} {words} [{line[f'{name}_low']:.2f}, {line[f'{name}_high']:.2f}]"
        parts.append(ratio + ("" if line.get(f"{name}_significant") else " (no measurable difference)"))
    return parts


def two_roads_text(line: dict[str, Any]) -> str:
    """``student on orin, Torch-TensorRT 2.5.0 vs ONNX → TensorRT: ×1.08 latency [1.02, 1.15], ×1.05 energy per
    image [...], top-1 97.9% vs 98.0% (device-measured), 1 op fell back to PyTorch (aten.adaptive_avg_pool2d ×1)``."""
    if line.get("error"):
        sent = f" (sent: {line['sent']})" if line.get("sent") else ""
        return (f"two roads     {line['rung']} on {line['device']}, Torch-TensorRT {line.get('torch_tensorrt')}: "
                f"{NOT_MEASURED}: {line['error']}{sent}")
    parts = ratio_parts(line)
    top1 = [f"{100 * line[key]:.1f}%" if line.get(key) is not None else NOT_MEASURED
            for key in ("torch_top1", "onnx_top1")]
    parts.append(f"top-1 {top1[0]} vs {top1[1]} (device-measured)")
    count = line.get("fallback_count")
    if count is None:
        parts.append(f"fallback {NOT_MEASURED}")
    else:
        ops = ", ".join(f"{name} ×{n}" for name, n in sorted(line.get("fallback_ops", {}).items()))
        parts.append(f"{count} op{'s' if count != 1 else ''} fell back to PyTorch" + (f" ({ops})" if ops else ""))
    exported = " (exported on the device from its checkpoint)" if line.get("exported_on_device") else ""
    return (f"two roads     {line['rung']} on {line['device']}, Torch-TensorRT {line.get('torch_tensorrt')}{exported} "
            f"vs ONNX → {line.get('onnx_runtime')}: " + ", ".join(parts))


def int8_vs_fp16_text(verdict: dict[str, Any]) -> str:
    """``INT8 vs FP16 on orin: ×0.61 latency [0.58, 0.64], ×0.70 energy per image [...], Δ top-1 −0.20 points
    (device-measured, McNemar p = 0.5)`` and, when INT8 does not pay off, why."""
    parts = ratio_parts(verdict)
    if verdict.get("top1_delta_points") is not None:
        p = f", McNemar p = {verdict['top1_p']:.2g}" if verdict.get("top1_p") is not None else ""
        parts.append(f"Δ top-1 {verdict['top1_delta_points']:+.2f} points ({verdict['top1_source']}{p})")
    kept = verdict.get("int8_kept_layers") or 0
    precision = (verdict.get("int8_kept_precision") or "fp16").upper()
    mixed = f" ({kept} layer{'s' if kept != 1 else ''} kept in {precision})" if kept else ""
    line = f"INT8{mixed} vs FP16 on {verdict['device']}: " + ", ".join(parts)
    if not verdict.get("pays_off"):
        # The headline names each reason in a clause; the section "Where the time goes" has the layers.
        line += "; INT8 does not pay off here: " + "; ".join(reason.split(" (")[0].split(": ")[0].rstrip(".")
                                                            for reason in verdict.get("reasons", []))
    return line


def accuracy_evidence(per_class: dict[str, Any] | None, before: str, after: str) -> dict[str, Any]:
    """The headline's accuracy significance from the evaluate stage's per-class comparison ``before → after``.

    Returns:
        ``accuracy_p`` (McNemar's exact p over every test image), ``accuracy_images``, ``per_class_tested``
        and ``significant_class_drops`` (class, change in points, Holm p), or Nones when the run did not
        record that comparison.
    """
    comparison = next((c for c in (per_class or {}).get("comparisons", [])
                       if c["before"] == before and c["after"] == after), None)
    if comparison is None or "overall" not in comparison:
        return {"accuracy_p": None, "accuracy_images": None, "per_class_tested": False, "significant_class_drops": []}
    drops = [{"class": row["class"], "change_points": row["change_points"], "p_holm": row["p_holm"]}
             for row in comparison["classes"] if row["significant"] and row["change_points"] < 0]
    return {"accuracy_p": comparison["overall"]["p_value"], "accuracy_images": comparison["overall"]["images"],
            "per_class_tested": True, "significant_class_drops": drops}

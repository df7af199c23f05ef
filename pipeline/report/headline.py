"""What every task's headline compares, written once: the lead student rung on the edge device against the teacher on
the data-center device (on the same device where no data-center device was measured, said so). Latency, throughput
and energy per image are ratios paired by round with their 95% intervals, said "no measurable difference" when the
interval holds 1; then the compute and the size. A task adds its score's row (top-1, mAP, mIoU) and its own findings.

The rows are read from a report's flat rows (one per rung × device): ``rung``, ``device``, ``role``, ``status``,
``latency_p50_ms``, ``throughput_images_per_s``, ``energy_mj_per_image``, ``peak_memory_mb`` with their windows
(``latency_p50_windows_ms``, ``throughput_windows``, ``energy_windows_mj``), ``size_mb``, ``macs_g`` and, where the
task has it, ``params_m``.
"""

from __future__ import annotations

from typing import Any, Sequence

from pipeline import stats
from pipeline.core.ladder import size_text

NOT_MEASURED = "not measured"
TEACHER = "teacher"
WINDOWED = (("latency", "latency_p50_windows_ms"), ("throughput", "throughput_windows"),
            ("energy", "energy_windows_mj"))
"""The figures compared round by round: the name in the headline's keys, and the row's windows."""


def direction(value: float | None, lower: str, higher: str) -> str:
    """A ratio in words: ``direction(2.31, "faster", "slower")`` → "2.31× slower"; 0.5 → "2.00× faster"."""
    if value is None:
        return NOT_MEASURED
    if abs(value - 1.0) < 5e-3:
        return "the same"
    return f"{1 / value:.2f}× {lower}" if value < 1 else f"{value:.2f}× {higher}"


def significant_direction(h: dict[str, Any], name: str, lower: str, higher: str, brief: bool = False) -> str:
    """A headline ratio in words with its 95% interval; "no measurable difference" when the interval holds 1.

    Args:
        brief: Leave out the interval (the console's one line); the verdict stays.
    """
    value, low, high = h.get(f"{name}_ratio"), h.get(f"{name}_ratio_low"), h.get(f"{name}_ratio_high")
    if value is None:
        return NOT_MEASURED
    if low is None or high is None:
        return direction(value, lower, higher) + ("" if brief else ", one window: no interval")
    interval = f"×{value:.2f} [{low:.2f}, {high:.2f}]" + ("" if brief else
                                                          f" over {h.get(f'{name}_windows', '?')} paired windows")
    if not h.get(f"{name}_ratio_significant"):
        return "no measurable difference" + ("" if brief else f": {interval}")
    return direction(value, lower, higher) + ("" if brief else f", {interval}")


def fmt(value, spec: str, missing: str = "—") -> str:
    """``value`` formatted by ``spec``, or ``missing`` when there is none."""
    return missing if value is None else format(value, spec)


def paired_ratio(a: list | None, b: list | None) -> tuple[float, float, float, bool] | None:
    """``a / b`` from two rows' windows, paired by round: (estimate, 95% low, high, significant), or None when
    either side has no windows, a window without a value, or no finite ratio."""
    if not a or not b or any(v is None for v in (*a, *b)):
        return None
    estimate, low, high = stats.ratio_interval(a, b)
    return (estimate, low, high, stats.significant(low, high)) if estimate == estimate else None


def ratio_fields(name: str, ratio: tuple | None, infix: str = "") -> dict[str, Any]:
    """``ratio`` (from :func:`paired_ratio`) as ``{name}_ratio``, ``{name}{infix}_low``, ``…_high`` and
    ``…_significant``; nothing when there is no ratio."""
    if ratio is None:
        return {}
    keys = (f"{name}_ratio", f"{name}{infix}_low", f"{name}{infix}_high", f"{name}{infix}_significant")
    return dict(zip(keys, ratio))


def baseline_device(rows: Sequence[dict[str, Any]], lead_device: str, rung: str = TEACHER) -> tuple[str, str | None]:
    """Where the lead is compared with ``rung``: the first data-center device that measured it, else the lead's own
    device — with a note saying so (None when a data-center device was measured)."""
    dc = next((r["device"] for r in rows if r.get("role") == "dc" and r["rung"] == rung
               and r["status"] == "measured"), None)
    if dc is not None:
        return dc, None
    return lead_device, (f"no data-center device measured the {rung} (DC=): its numbers come from the same device, "
                         f"{lead_device}")


def edge_vs_dc(student: dict[str, Any], teacher: dict[str, Any]) -> dict[str, Any]:
    """The lead rung's row (``student``) against the baseline's (``teacher``), as every headline holds them: each
    side's latency p50, throughput, energy per image, peak memory and size, their ratios (paired by round, with
    intervals, where both rows have windows), and the share of the teacher's compute and parameters."""
    def ratio(a, b):
        return a / b if a is not None and b else None

    paired = {}
    for name, key in WINDOWED:
        found = paired_ratio(student.get(key), teacher.get(key))
        if found:
            paired.update(ratio_fields(name, found, "_ratio"),
                          **{f"{name}_windows": min(len(student[key]), len(teacher[key]))})
    throughput = (student.get("throughput_images_per_s"), teacher.get("throughput_images_per_s"))
    energy = (student.get("energy_mj_per_image"), teacher.get("energy_mj_per_image"))
    return {"latency_p50_ms_edge": student.get("latency_p50_ms"), "latency_p50_ms_dc": teacher.get("latency_p50_ms"),
            "latency_ratio": ratio(student.get("latency_p50_ms"), teacher.get("latency_p50_ms")), **paired,
            "throughput_edge": throughput[0], "throughput_dc": throughput[1], "throughput_ratio": ratio(*throughput),
            "energy_mj_edge": energy[0], "energy_mj_dc": energy[1], "energy_ratio": ratio(*energy),
            "peak_memory_mb_edge": student.get("peak_memory_mb"), "peak_memory_mb_dc": teacher.get("peak_memory_mb"),
            "size_mb_edge": student.get("size_mb"), "size_mb_dc": teacher.get("size_mb"),
            "macs_ratio": ratio(student.get("macs_g"), teacher.get("macs_g")),
            "params_ratio": ratio(student.get("params_m"), teacher.get("params_m"))}


def speed_rows(h: dict[str, Any], unit: str = "images/s") -> list[tuple[str, str]]:
    """The latency p50 and throughput rows: each side's figure and the ratio in words with its interval."""
    rows = []
    if h.get("latency_p50_ms_edge") is not None and h.get("latency_p50_ms_dc") is not None:
        rows.append(("latency p50", f"{h['latency_p50_ms_edge']:.3f} ms vs {h['latency_p50_ms_dc']:.3f} ms  "
                                    f"({significant_direction(h, 'latency', 'faster', 'slower')})"))
    if h.get("throughput_edge") is not None and h.get("throughput_dc") is not None:
        rows.append(("throughput", f"{h['throughput_edge']:.0f} vs {h['throughput_dc']:.0f} {unit}  "
                                   f"({significant_direction(h, 'throughput', 'lower', 'higher')})"))
    return rows


def energy_row(h: dict[str, Any]) -> tuple[str, str]:
    """Energy per image on each side, and its ratio where both were measured; or why it was not measured."""
    if h.get("energy_mj_edge") is None and h.get("energy_mj_dc") is None:
        return "energy/image", NOT_MEASURED + (f" ({h['energy_reason']})" if h.get("energy_reason") else "")
    return "energy/image", (f"{fmt(h['energy_mj_edge'], '.2f', NOT_MEASURED)} vs "
                            f"{fmt(h['energy_mj_dc'], '.2f', NOT_MEASURED)} mJ"
                            + (f"  ({significant_direction(h, 'energy', 'less', 'more')})" if h.get("energy_ratio")
                               else ""))


def compute_row(h: dict[str, Any], against: str = TEACHER) -> list[tuple[str, str]]:
    """The student's share of the teacher's MACs (and parameters, where the task counts them); none without MACs."""
    if h.get("macs_ratio") is None:
        return []
    params = h.get("params_ratio")
    smaller = h["macs_ratio"] < 1 and (params is None or params < 1)
    return [("compute", f"{100 * h['macs_ratio']:.1f}% of the {against}'s MACs"
                        + (f", {100 * params:.1f}% of its parameters" if params is not None else "")
                        + f" ({'smaller' if smaller else 'NOT smaller'})")]


def size_row(h: dict[str, Any], edge: str, dc: str) -> tuple[str, str]:
    """Like with like: the student's FP32 form against the teacher's (and the deployed rung's size); without the
    student's FP32 size, the deployed rung against the baseline as measured (``edge``, ``dc``: their precisions)."""
    if h.get("size_mb_student_fp32") is not None:
        smaller = direction(h["size_mb_student_fp32"] / h["size_mb_dc"] if h["size_mb_dc"] else None, "smaller",
                            "larger")
        return "size, FP32", (f"{size_text(h['size_mb_student_fp32'])} vs {size_text(h['size_mb_dc'])}  ({smaller}); "
                              f"deployed {edge} {size_text(h['size_mb_edge'])}")
    return "model size", f"{size_text(h['size_mb_edge'])} {edge} vs {size_text(h['size_mb_dc'])} {dc}"

"""The report's "Where the frame's time goes": each rung's path from camera bytes to top-k on each device
(``deploy.frame``, measured by :mod:`device.frame`), part by part with intervals over the frame rounds, the
sequential and pipelined frame rates, and the part that bounds them. A library of the classification report.
"""

from __future__ import annotations

from typing import Any, Sequence

from device.frame_schema import FRAME_STAGES
from pipeline import stats
from pipeline.results import interval_cell
from pipeline.sections import Figure, Section, Table, Text

PARTS = (*FRAME_STAGES, "total")
FRAME_COLUMNS = (*(f"frame_{part}_ms{end}" for part in PARTS for end in ("", "_low", "_high")),
                 *(f"frame_fps_{kind}{end}" for kind in ("sequential", "pipelined") for end in ("", "_low", "_high")),
                 "frame_bound", "frame_bound_text", "frame_spec", "frame_batch", "frame_note", "frame_error")
FRAME_TEXT = ("Each rung on each device timed from a camera frame's bytes to its top-5 classes, one frame after "
              "another: decode (JPEG; NV12 converted to BGR), preprocess (the model's own: BGR → RGB, resize, "
              "centre crop, normalize, on the device's CPU with OpenCV), the engine call (its host↔device copies "
              "inside), post-processing (top-k). Each part's median over the frames of a round, then the median of "
              "the rounds with its 95% interval. Pipelined: decode and preprocess run in a thread of their own ahead "
              "of the engine (a bounded queue between), as a camera application runs them; the slower thread sets "
              "the rate. The parts' medians need not add up to the total's median; each interval is over the frame "
              "rounds of one job.")


def frame_fields(rounds: Sequence[Any]) -> dict[str, Any]:
    """A ladder row's frame figures from the round that timed the frame's path (:class:`device.schema.JobResult`)."""
    frame = next((result.frame for result in rounds if getattr(result, "frame", None) is not None), None)
    if frame is None:
        error = next((result.frame_error for result in rounds if getattr(result, "frame_error", None)), None)
        return {"frame_error": error} if error else {}
    out: dict[str, Any] = {}
    for times in (*frame.stages, frame.total):
        out.update(zip((f"frame_{times.stage}_ms", f"frame_{times.stage}_ms_low", f"frame_{times.stage}_ms_high"),
                       stats.median_interval(times.round_medians_ms)))
    for kind, values in (("sequential", frame.sequential_fps_rounds), ("pipelined", frame.pipelined_fps_rounds)):
        out.update(zip((f"frame_fps_{kind}", f"frame_fps_{kind}_low", f"frame_fps_{kind}_high"),
                       stats.median_interval(values)))
    spec = frame.spec
    return {**out, "frame_bound": frame.bound, "frame_bound_text": frame.bound_text,
            "frame_spec": f"{spec.width}×{spec.height} {spec.format}", "frame_batch": frame.batch_size,
            "frame_note": frame.note or None}


def framed(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in rows if row.get("frame_total_ms") is not None]


def frame_asked(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether any row's frame was timed, or failed to be (the section then says why)."""
    return any(row.get("frame_total_ms") is not None or row.get("frame_error") for row in rows)


def frame_section(data: dict[str, Any], figures: dict[str, Any] | None) -> Section:
    """The section: what is timed, the figure (when plots are drawn), and one row per rung × device."""
    rows = framed(data["rows"])
    header = ["rung", "device", "frame", *(f"{part} ms" for part in FRAME_STAGES), "total ms [95% CI]",
              "fps, one by one", "fps, pipelined [95% CI]", "what bounds it"]
    table = [header] + [
        [r["rung"], r["device"], r["frame_spec"], *(format(r[f"frame_{part}_ms"], ".2f") for part in FRAME_STAGES),
         interval_cell(r["frame_total_ms"], r["frame_total_ms_low"], r["frame_total_ms_high"], ".2f"),
         format(r["frame_fps_sequential"], ".0f"),
         interval_cell(r["frame_fps_pipelined"], r["frame_fps_pipelined_low"], r["frame_fps_pipelined_high"], ".0f"),
         r["frame_bound_text"]] for r in rows]
    blocks: list = [Text(FRAME_TEXT)]
    if figures is not None and "frame:parts" in figures:
        shown = figures["frame:parts"]
        blocks.append(shown if isinstance(shown, (Figure, Text)) else Figure(
            "frame:parts", shown, "Where each frame's time goes, per rung and device: the parts' medians stacked "
                                  "(one frame after another)."))
    notes = sorted({r["frame_note"] for r in rows if r.get("frame_note")})
    failed = [Text(f"Not timed: {r['rung']} on {r['device']}: {r['frame_error']}.") for r in data["rows"]
              if r.get("frame_error")]
    return Section("Where the frame's time goes", [*blocks, *([Table(table)] if rows else []),
                                                   *(Text(f"Note: {n}.") for n in notes), *failed])


def frame_plot(plt, rows: Sequence[dict[str, Any]]) -> str:
    """A horizontal stacked bar per rung × device: decode, preprocess, engine, post-processing (ms)."""
    from pipeline.sections import figure_png

    rows = framed(rows)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)))
    labels = [f"{r['rung']} · {r['device']}" for r in rows]
    left = [0.0] * len(rows)
    for index, part in enumerate(FRAME_STAGES):
        widths = [r[f"frame_{part}_ms"] for r in rows]
        ax.barh(labels, widths, left=left, color=plt.cm.tab10(index), label=part)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel(f"ms per frame ({rows[0]['frame_spec']})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return figure_png(fig)


def frame_headline(row: dict[str, Any] | None) -> str | None:
    """The headline's frame line for the lead rung on the edge device, or None without a frame measured."""
    if not row or row.get("frame_total_ms") is None:
        return None
    outside = 1 - row["frame_engine_ms"] / row["frame_total_ms"] if row["frame_total_ms"] else 0.0
    return (f"{row['frame_spec']}: {row['frame_total_ms']:.2f} ms a frame one by one ({100 * outside:.0f}% outside "
            f"the engine); {row['frame_bound_text']}")

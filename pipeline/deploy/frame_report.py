"""The report's "Where the frame's time goes", every task's: each rung's path from camera bytes to the task's answer
on each device (``deploy.frame``, measured by :mod:`device.jobs.frame`), part by part with intervals over the frame rounds,
the sequential and pipelined frame rates, and the part that bounds them. A task that scores the evaluation images
through the whole path (classification's top-1) hands :func:`frame_fields` its scoring.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from device.jobs.frame_schema import FRAME_STAGES
from pipeline import stats
from pipeline.report.results import interval_cell
from pipeline.report.sections import Figure, Section, Table, Text

PARTS = (*FRAME_STAGES, "total")
_ENDS = ("", "_low", "_high")
FRAME_COLUMNS = (*(f"frame_{part}_ms{end}" for part in PARTS for end in _ENDS),
                 *(f"frame_fps_{kind}{end}" for kind in ("sequential", "pipelined") for end in _ENDS),
                 "frame_bound", "frame_bound_text", "frame_spec", "frame_batch", "frame_agreement", "frame_note",
                 "frame_error",
                 "frame_copies_h2d_ms", "frame_copies_d2h_ms", "frame_power_w", "frame_energy_mj", "frame_power_source",
                 "frame_temp_peak_c",
                 *(f"frame_in_graph_{name}{end}" for name in ("total_ms", "fps_pipelined", "speedup") for end in _ENDS),
                 "frame_in_graph_engine_ms", "frame_in_graph_bound_text", "frame_in_graph_error",
                 "frame_images", "frame_scores_error", "frame_top1", "frame_top1_tensor", "frame_top1_delta_points", "frame_top1_p",
                 "frame_in_graph_top1")
# What each task's post-processing is, in the section's words (the job's FrameSpec.postprocess).
ANSWERS = {"top_k": ("its top-5 classes", "top-k"), "detection": ("its boxes", "decode + NMS"),
           "segmentation": ("its mask", "the argmax over classes")}
FRAME_TEXT = ("Each rung on each device timed from a camera frame's bytes to {answer}, one frame after "
              "another: decode (JPEG; NV12 converted to RGB), preprocess (the model's own: BGR → RGB, resize the "
              "shorter side, centre crop, normalize, on the device's CPU with OpenCV), the engine call (its "
              "host↔device copies inside), post-processing ({post}). Each part's median over the frames of a round, then the median of "
              "the rounds with its 95% interval. Pipelined: decode and preprocess run in a thread of their own ahead "
              "of the engine (a bounded queue between), as a camera application runs them; the slower thread sets "
              "the rate. The parts' medians need not add up to the total's median; each interval is over the frame "
              "rounds of one job.")


def frame_fields(rounds: Sequence[Any],
                 whole_path: Callable[[Any, Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ladder row's frame figures from the round that timed the frame's path (:class:`device.schema.JobResult`):
    the CPU path's parts and rates; the in-graph form's, and its speedup over the CPU path paired by round; and,
    with ``source: images``, what the task's ``whole_path`` makes of the scores (the frame's ``scores`` and the same
    engine's evaluation of the tensors, or None)."""
    result = next((result for result in rounds if getattr(result, "frame", None) is not None), None)
    if result is None:
        error = next((result.frame_error for result in rounds if getattr(result, "frame_error", None)), None)
        return {"frame_error": error} if error else {}
    frame = result.frame
    out: dict[str, Any] = {}
    for times in (*frame.stages, frame.total):
        out.update(zip((f"frame_{times.stage}_ms", f"frame_{times.stage}_ms_low", f"frame_{times.stage}_ms_high"),
                       stats.median_interval(times.round_medians_ms)))
    for kind, values in (("sequential", frame.sequential_fps_rounds), ("pipelined", frame.pipelined_fps_rounds)):
        out.update(zip((f"frame_fps_{kind}", f"frame_fps_{kind}_low", f"frame_fps_{kind}_high"),
                       stats.median_interval(values)))
    if frame.copies_ms:
        out.update(frame_copies_h2d_ms=frame.copies_ms.get("h2d"), frame_copies_d2h_ms=frame.copies_ms.get("d2h"))
    if frame.power is not None:
        out.update(frame_power_w=frame.power.mean_mw / 1000, frame_energy_mj=frame.power.energy_mj_per_frame,
                   frame_power_source=frame.power.source, frame_temp_peak_c=frame.power.temp_peak_c)
    graph = frame.in_graph
    if graph is not None:
        out.update(zip((f"frame_in_graph_total_ms{end}" for end in _ENDS), stats.median_interval(
            graph.total.round_medians_ms)))
        out.update(zip((f"frame_in_graph_fps_pipelined{end}" for end in _ENDS),
                       stats.median_interval(graph.pipelined_fps_rounds)))
        out.update(zip((f"frame_in_graph_speedup{end}" for end in _ENDS),
                       stats.ratio_interval(frame.total.round_medians_ms, graph.total.round_medians_ms)))
        out.update(frame_in_graph_engine_ms=next(s.median_ms for s in graph.stages if s.stage == "engine"),
                   frame_in_graph_bound_text=graph.bound_text)
    if frame.in_graph_error:  # not timed, or timed and then failed while scoring the images
        out["frame_in_graph_error"] = frame.in_graph_error
    if frame.scores is not None and whole_path is not None:
        out.update(whole_path(frame.scores, _same_engine(result, frame.batch_size)))
    spec = frame.spec
    return {**out, "frame_bound": frame.bound, "frame_bound_text": frame.bound_text,
            "frame_spec": f"{spec.width}×{spec.height} {spec.format}", "frame_batch": frame.batch_size,
            # The share of frames whose pipelined answer was the one-by-one answer (1.0 on a deterministic runtime).
            "frame_agreement": frame.top1_agreement,
            "frame_note": frame.note or None, "frame_postprocess": spec.postprocess}


def _same_engine(result, batch_size: int):
    """The evaluation of the engine the frames ran on: the first accelerator's engine for their batch (TensorRT builds
    one per batch, each may choose other precisions), or the one model that serves every batch; None otherwise."""
    first = result.evaluation.accelerator if result.evaluation is not None else None  # a sweep's names it
    scored = [e for e in (result.evaluation, *result.more_evaluations) if e is not None and e.accelerator == first]
    return next((e for e in scored if e.batch_size == batch_size), scored[0] if len(scored) == 1 else None)


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
    answer, post = ANSWERS[next((r["frame_postprocess"] for r in rows if r.get("frame_postprocess")), "top_k")]
    blocks: list = [Text(FRAME_TEXT.format(answer=answer, post=post))]
    if figures is not None and "frame:parts" in figures:
        shown = figures["frame:parts"]
        blocks.append(shown if isinstance(shown, (Figure, Text)) else Figure(
            "frame:parts", shown, "Where each frame's time goes, per rung and device: the parts' medians stacked "
                                  "(one frame after another)."))
    notes = sorted({r["frame_note"] for r in rows if r.get("frame_note")})
    files = data.get("frame_files") or {}
    notes += [note for note in (files.get("in_graph_note"), files.get("images_note")) if note]
    notes += [f"{r['rung']} on {r['device']}: {r['frame_power_w']:.2f} W ({r['frame_power_source']}) over the frame "
              f"timing, {r['frame_energy_mj']:.2f} mJ a frame (the window's energy over every frame run in it: an "
              "average over the forms and modes the rounds interleave)"
              for r in rows if r.get("frame_power_w") is not None]
    notes += [f"{r['rung']} on {r['device']}: host→device copy {r['frame_copies_h2d_ms']:.3f} ms, device→host "
              f"{r['frame_copies_d2h_ms']:.3f} ms a frame, inside the engine's time (CUDA events)"
              for r in rows if r.get("frame_copies_h2d_ms") is not None]
    failed = [Text(f"Not timed: {r['rung']} on {r['device']}: {r['frame_error']}.") for r in data["rows"]
              if r.get("frame_error")]
    failed += [Text(f"In-graph form not timed: {r['rung']} on {r['device']}: {r['frame_in_graph_error']}.")
               for r in data["rows"] if r.get("frame_in_graph_error")]
    failed += [Text(f"Whole-path accuracy: {r['rung']} on {r['device']}: {r['frame_scores_error']}.")
               for r in data["rows"] if r.get("frame_scores_error")]
    return Section("Where the frame's time goes",
                   [*blocks, *([Table(table)] if rows else []), *in_graph_blocks(rows, files), *accuracy_blocks(rows),
                    *(Text(f"Note: {n}.") for n in notes), *failed])


def in_graph_words(row: dict[str, Any]) -> str:
    """Which form is faster on this rung and device, by how much, or that the rounds cannot tell."""
    ratio, low, high = (row[f"frame_in_graph_speedup{end}"] for end in _ENDS)
    if not (low <= 1 <= high):  # NaN bounds (one round) compare False: said as measured, without an interval
        if ratio >= 1:
            return f"{ratio:.2f}× faster in the graph [{low:.2f}, {high:.2f}]"
        return f"{1 / ratio:.2f}× faster on the CPU [{1 / high:.2f}, {1 / low:.2f}]"
    return f"no measurable difference (CPU ÷ in-graph {ratio:.2f}× [{low:.2f}, {high:.2f}])"


def in_graph_blocks(rows: Sequence[dict[str, Any]], files: dict[str, Any] | None = None) -> list:
    """The two preprocessing forms side by side, where the in-graph one was timed."""
    timed = [r for r in rows if r.get("frame_in_graph_total_ms") is not None]
    if not timed:
        return []
    table = [["rung", "device", "CPU path ms [95% CI]", "in the graph ms [95% CI]", "fps pipelined, in the graph",
              "which is faster"]] + [
        [r["rung"], r["device"], interval_cell(r["frame_total_ms"], r["frame_total_ms_low"], r["frame_total_ms_high"],
                                               ".2f"),
         interval_cell(r["frame_in_graph_total_ms"], r["frame_in_graph_total_ms_low"],
                       r["frame_in_graph_total_ms_high"], ".2f"),
         interval_cell(r["frame_in_graph_fps_pipelined"], r["frame_in_graph_fps_pipelined_low"],
                       r["frame_in_graph_fps_pipelined_high"], ".0f"), in_graph_words(r)] for r in timed]
    checked = (f" On this run's frames its largest difference was {difference:.4f} (normalized units)."
               if (difference := (files or {}).get("in_graph_difference")) is not None else "")
    return [Text("Preprocessing in the graph: the same frames with resize, crop, colour conversion and normalization "
                 "written into the engine's graph (a uint8 frame in; JPEG still decoded on the CPU), timed in the "
                 "same rounds as the CPU path, interleaved. Its output matches the CPU path's within a tolerance "
                 f"stated and tested per interpolation ({_levels()}).{checked} The ratio is the CPU path's frame time "
                 "over the in-graph one, paired by round."), Table(table)]


def _levels() -> str:
    from pipeline.deploy.frame_prefix import MARGIN_LEVELS, MEASURED_LEVELS, NV12_EXTRA_LEVELS

    return (", ".join(f"{mode} {MEASURED_LEVELS[mode] + MARGIN_LEVELS:g}" for mode in sorted(MEASURED_LEVELS))
            + f" levels of 255; {NV12_EXTRA_LEVELS:g} more for NV12")


def accuracy_blocks(rows: Sequence[dict[str, Any]]) -> list:
    """The deployed path's top-1 beside the tensor path's (``source: images``)."""
    scored = [r for r in rows if r.get("frame_top1") is not None]
    if not scored:
        return []

    def cell(value):
        return "—" if value is None else f"{100 * value:.2f}%"

    table = [["rung", "device", "images", "tensor path top-1", "whole path top-1", "Δ points", "McNemar p",
              "whole path, in the graph"]] + [
        [r["rung"], r["device"], str(r["frame_images"]), cell(r.get("frame_top1_tensor")), cell(r["frame_top1"]),
         "—" if r.get("frame_top1_delta_points") is None else f"{r['frame_top1_delta_points']:+.2f}",
         "—" if r.get("frame_top1_p") is None else f"{r['frame_top1_p']:.3g}", cell(r.get("frame_in_graph_top1"))]
        for r in scored]
    return [Text("The deployed path's accuracy: each evaluation image scaled to fit the frame, centred, encoded "
                 "in the frame's format, then decoded, preprocessed and run on the device as an application would; "
                 "beside the same engine's top-1 on the tensors the build host preprocessed (the same images)."),
            Table(table)]


def frame_plot(plt, rows: Sequence[dict[str, Any]]) -> str:
    """A horizontal stacked bar per rung × device: decode, preprocess, engine, post-processing (ms)."""
    from pipeline.report.sections import figure_png

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
    text = (f"{row['frame_spec']}: {row['frame_total_ms']:.2f} ms a frame one by one ({100 * outside:.0f}% outside "
            f"the engine); {row['frame_bound_text']}")
    if row.get("frame_in_graph_total_ms") is not None:
        words = in_graph_words(row)
        text += f"; preprocessing {'in the graph or on the CPU: ' if words.startswith('no ') else ''}{words}"
    if row.get("frame_top1") is not None:
        text += f"; top-1 through the whole path {100 * row['frame_top1']:.2f}%"
        if row.get("frame_top1_tensor") is not None:
            text += (f" (tensor path {100 * row['frame_top1_tensor']:.2f}%, McNemar p = "
                     f"{row['frame_top1_p']:.2g})")
    return text


def frame_rows(deploy: dict[str, Any]) -> list[dict[str, Any]]:
    """A scored task's frame figures (:func:`pipeline.deploy.records.timed_record`'s ``frame``), one row per rung ×
    device that timed the frame's path or failed to."""
    return [{"rung": rung, "device": device["name"], **record["frame"]}
            for device in deploy.get("devices", []) for rung, record in device.get("rungs", {}).items()
            if record.get("frame")]


def frame_sections(deploy: dict[str, Any]) -> list[Section]:
    """"Where the frame's time goes" of a scored task's run, or nothing without ``deploy.frame``."""
    rows = frame_rows(deploy)
    return [frame_section({"rows": rows, "frame_files": deploy.get("frame")}, None)] if frame_asked(rows) else []

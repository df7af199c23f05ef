"""The report sections on where a rung's time goes, shared by every task: the per-layer profile of the engine
that ran (top layers, what they ran in, why INT8 may not pay off) and the latencies as trtexec reports them.

A task hands in ``layer_profiles`` entries (``device``, ``rung``, ``runtime``, ``status``, ``profile`` or ``reason``)
and rows with the latency fields the result schema declares (:data:`pipeline.report.results.REPORTED`).
"""

from __future__ import annotations

from typing import Any

from pipeline.report.results import figure_cell, figure_label
from pipeline.report.sections import Bullets, Section, Table, Text

NOT_MEASURED = "not measured"


TOP_LAYERS = 5


def time_table(table: dict[str, Any]) -> dict[str, Any]:
    # Profiles stored before the overhead split counted Q/DQ and reformats as INT8: the model splits them on load.
    if "overhead_share" in table:
        return table
    from device.jobs.profile import BatchProfile

    return BatchProfile.model_validate(table).model_dump()


def _time_summary(table: dict[str, Any], device: str) -> str:
    """One sentence: INT8 compute, Q/DQ/reformat/cast overhead and float shares, the DLA share and fallbacks,
    the costliest layer left in float."""
    from device.jobs.profile import FLOAT_PRECISIONS

    table = time_table(table)
    floats: dict[str, float] = {}
    for layer in table["layers"]:
        if not layer.get("overhead") and layer["precision"] in FLOAT_PRECISIONS:
            floats[layer["precision"]] = floats.get(layer["precision"], 0.0) + layer["share"]
    float_share = sum(floats.values())
    other = max(0.0, 1.0 - table["int8_share"] - table["overhead_share"] - float_share) if table["layers"] else 0.0
    text = (f"INT8 compute takes {100 * table['int8_share']:.1f}% of the time, Q/DQ/reformat/cast overhead "
            f"{100 * table['overhead_share']:.1f}%, float layers {100 * float_share:.1f}%"
            + (f" ({', '.join(f'{p} {100 * v:.1f}%' for p, v in sorted(floats.items(), key=lambda kv: -kv[1]))})"
               if floats else "")
            + (f", other {100 * other:.1f}%" if other >= 0.0005 else "") + ".")
    if table["float_left_behind"]:
        name = table["float_left_behind"][0]
        layer = next(l for l in table["layers"] if l["name"] == name)
        text += (f" Biggest layer left in float: {name} ({layer['kind']}, {layer['precision']}, "
                 f"{100 * layer['share']:.1f}%).")
    if table["int8_share"] == 0:
        text += (" No compute layer ran in INT8: only its Q/DQ did." if any(
            l.get("overhead") == "qdq" for l in table["layers"]) else " No INT8 layers: the model runs in float.")
    if table.get("dla_share") is not None:
        fallbacks = table["fallback_layers"]
        text += (f" DLA: {100 * table['dla_share']:.1f}% of the time; "
                 + (f"{len(fallbacks)} layer(s) fell back to the GPU: {', '.join(fallbacks[:5])}"
                    + (f" (+{len(fallbacks) - 5})" if len(fallbacks) > 5 else "") + "." if fallbacks
                    else "no layer fell back to the GPU."))
    return text


def _payoff_reasons(table: dict[str, Any], runtime: str) -> list[str]:
    from device.jobs.profile import BatchProfile, int8_payoff_reasons

    return int8_payoff_reasons(BatchProfile.model_validate(table), runtime)


_OVERHEAD_LABEL = {"qdq": "Q/DQ", "reformat": "reformat", "cast": "cast"}


def _time_rows(table: dict[str, Any]) -> list[list[str]]:
    rows = [["layer", "kind", "precision", "device", "ms", "share"]]
    for layer in time_table(table)["layers"][:TOP_LAYERS]:
        # Overhead rows say so beside their precision: a DequantizeLinear touches INT8 but computes nothing.
        overhead = layer.get("overhead")
        rows.append([layer["name"], layer["kind"], layer["precision"]
                     + (f" ({_OVERHEAD_LABEL[overhead]} overhead)" if overhead else ""), layer["device"]
                     + (" (fell back)" if layer.get("fell_back") else ""), f"{layer['time_ms']:.4f}",
                     f"{100 * layer['share']:.1f}%"])
    return rows


def shown_batch(profile: dict[str, Any]) -> dict[str, Any]:
    # The latency batch (the smallest), as the ladder's latency column; results.json keeps every batch.
    return min(profile["batches"], key=lambda b: b["batch_size"])


INT8_FIX = ("measure it where TensorRT builds INT8 engines: EDGE=http://<jetson>:8765 (make agent on the Jetson) or "
            "DC=http://<gpu-server>:8765 (an agent with TensorRT)")


def computes_in(profile: dict[str, Any] | None, precision: str) -> bool:
    """Whether a compute layer of a rung's own profile ran in ``precision`` (true where no profile says otherwise, and
    for fp32): ONNX Runtime's CPU provider runs a Q/DQ graph with every quantize and dequantize node a layer of its
    own, and no compute layer in INT8."""
    if not profile or precision == "fp32":
        return True
    layers = time_table(shown_batch(profile))["layers"]
    return any(_get(layer, "precision") == precision and not _get(layer, "overhead") for layer in layers)


def int8_not_run_reason(runtime: str | None) -> str:
    """Why a headline leads with a float rung where the device ran the INT8 rung without INT8 compute."""
    return (f"no compute layer ran in INT8 there: {runtime or 'the runtime'} ran the INT8 rung's Q/DQ graph with its "
            "quantize and dequantize nodes as layers of their own (its profile, \"Where the time goes\")")


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


TIMINGS_TEXT = ("Three latencies of the same timed calls at the latency batch, each the median over the interleaved "
                "windows with its 95% interval. Wall: the whole call as an application sees it (the batch copied "
                "into the runtime, the copies, the enqueue, the wait, Python) — the ladder's p50. trtexec Latency: "
                "host-to-device copy + GPU compute + device-to-host copy, timed with CUDA events on pinned "
                "buffers, the input shape set once — compare this with trtexec's \"Latency\". GPU Compute: CUDA "
                "events around execute_async_v3 — trtexec's \"GPU Compute Time\". One inference is in flight at a "
                "time, synchronized after each call: trtexec --exposeDMA, not trtexec's default of overlapped "
                "streams, whose throughput can be higher. ONNX Runtime and torch rows have the wall time only.")


TIMING_COLUMNS = ("latency_p50_ms", "trt_latency_p50_ms", "gpu_compute_p50_ms")
"""The three latencies of the same calls (the declared fields' columns) the timings table sets side by side."""


def timing_rows(data: dict[str, Any]) -> list[list[str]]:
    """Per measured row: wall, trtexec Latency and GPU Compute p50 with their intervals (— where not taken)."""
    wall, *device_times = TIMING_COLUMNS
    table = [["rung", "device", "runtime", f"wall {figure_label(wall)}", *map(figure_label, device_times)]]
    for r in data["rows"]:
        if r["status"] != "measured":
            continue
        table.append([r["rung"], r["device"], f"{r['runtime']} {r['precision']}",
                      *(figure_cell(r, column, with_interval=True) for column in TIMING_COLUMNS)])
    return table


def has_device_timings(data: dict[str, Any]) -> bool:
    return any(r.get("trt_latency_p50_ms") is not None for r in data["rows"])


def time_section(data: dict[str, Any]) -> Section:
    """The "Where the time goes" section: per rung × device, the top layers by time and what they ran in."""
    section = Section("Where the time goes", [Text(
        "Per-layer profile of the engine that ran, from a separate pass after the timed windows (TensorRT: "
        "IEngineInspector + IProfiler; ONNX Runtime: its profiler). The latency batch is shown; results.json "
        f"carries every batch and layer. Top {TOP_LAYERS} layers by time:")])
    for entry in data["layer_profiles"]:
        if entry["status"] != "measured":
            section.blocks.append(Section(f"{entry['rung']} on {entry['device']}",
                                          [Text(f"{NOT_MEASURED}: {entry['reason']}")], level=3))
            continue
        profile = entry["profile"]
        table = shown_batch(profile)
        blocks: list = [Text(_time_summary(table, entry["device"]))]
        reasons = _payoff_reasons(table, entry["runtime"])
        if reasons:
            blocks += [Text("Why INT8 may not pay off here:"), Bullets([("", reason) for reason in reasons])]
        blocks.append(Table(_time_rows(table)))
        if profile.get("notes"):  # what the numbers leave out (ops outside the engines, unknown precisions …)
            blocks.append(Bullets([("", note) for note in profile["notes"]]))
        section.blocks.append(Section(f"{entry['rung']} on {entry['device']} ({entry['runtime']}, "
                                      f"{profile['requested_device']}, batch {table['batch_size']})", blocks, level=3))
    return section

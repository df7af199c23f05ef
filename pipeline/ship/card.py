"""The shipped rung's card: what it was chosen on, each figure with the device, power mode, batch and date it was
measured under, the teacher's beside it (``card.json``, and ``card.md`` for people)."""

from __future__ import annotations

from typing import Any

from pipeline.ship.task import ShipRow

# Figures of a row the card shows, in order: (key, label, unit, format).
FIGURES = (("latency_p50_ms", "latency p50", "ms", ".3f"), ("latency_p99_ms", "latency p99", "ms", ".3f"),
           ("throughput_images_per_s", "throughput", "images/s", ".0f"),
           ("energy_mj_per_image", "energy per image", "mJ", ".2f"), ("power_mean_w", "mean power", "W", ".2f"),
           ("peak_memory_mb", "peak memory", "MB", ".0f"), ("frame_total_ms", "frame to answer", "ms", ".2f"),
           ("frame_fps_pipelined", "frames pipelined", "frames/s", ".1f"),
           ("sustained_ratio", "sustained (settled / burst p50)", "×", ".2f"))


MEASURED_ALWAYS = {"latency_p50_ms", "latency_p99_ms", "throughput_images_per_s", "energy_mj_per_image",
                   "power_mean_w", "peak_memory_mb"}
"""Figures every deploy measures where it can: one it could not is a row saying so, never left out."""


def conditions(info: dict[str, Any], row: ShipRow, date: str | None) -> dict[str, Any]:
    """Where and how the figures were measured."""
    mode = info.get("nvpmodel")
    mode_name = mode.get("name") if isinstance(mode, dict) else mode
    gpu = info.get("gpu") if info.get("gpu") not in (None, "unknown") else None
    return {"device": row.device, "board": info.get("board") or f"{info.get('hostname')} ({info.get('machine')})",
            "l4t": info.get("l4t"), "jetpack": info.get("jetpack"), "tensorrt": info.get("tensorrt"),
            "gpu": gpu, "compute_capability": info.get("compute_capability"),
            "power_mode": mode_name, "jetson_clocks": info.get("jetson_clocks"), "runtime": row.runtime,
            "precision": row.precision if not row.precision_ran else f"{row.precision} graph (no {row.precision.upper()} "
                                                                     "compute ran)", "batch": row.batch, "date": date}


def card_document(row: ShipRow, teacher: ShipRow | None, why: str, metric: str, info: dict[str, Any],
                  date: str | None, engine: dict[str, Any], deepstream: dict[str, Any], extra: dict[str, Any]) -> dict:
    """``card.json``."""
    def figures(of: ShipRow | None) -> dict[str, Any] | None:
        if of is None:
            return None
        shown = {"accuracy": of.accuracy, "accuracy_low": of.accuracy_low, "accuracy_high": of.accuracy_high,
                 "accuracy_source": of.accuracy_source, "latency_p50_ms": of.latency_p50_ms}
        shown.update({key: of.figures.get(key) for key, *_ in FIGURES if key != "latency_p50_ms"})
        return shown

    return {"schema": "edgefold.card/1", "rung": row.rung, "chosen": why, "metric": metric,
            "figures": figures(row), "teacher": figures(teacher), "measured_under": conditions(info, row, date),
            "flags": list(row.flags), "verdict": row.verdict, "precision_ran": row.precision_ran,
            "engine": engine, "deepstream": deepstream, **extra}


def _value(value: Any, fmt: str, unit: str) -> str:
    return "not measured" if value is None else f"{format(value, fmt)} {unit}".strip()


def card_markdown(card: dict[str, Any]) -> str:
    """``card.md``: the same facts for a person."""
    row, teacher, under = card["figures"], card["teacher"] or {}, card["measured_under"]
    metric = card["metric"]

    def accuracy(of: dict[str, Any]) -> str:
        if not of or of.get("accuracy") is None:
            return "not measured"
        interval = (f" [{100 * of['accuracy_low']:.2f}, {100 * of['accuracy_high']:.2f}]"
                    if of.get("accuracy_low") is not None and of.get("accuracy_high") is not None else "")
        return f"{100 * of['accuracy']:.2f}{interval} ({of.get('accuracy_source')})"

    lines = [f"# {card['rung']} on {under['device']}", "", f"Chosen: {card['chosen']}.", "",
             f"| figure | {card['rung']} | teacher |", "|---|---|---|",
             f"| {metric} | {accuracy(row)} | {accuracy(teacher)} |"]
    for key, label, unit, fmt in FIGURES:
        if row.get(key) is None and teacher.get(key) is None and key not in MEASURED_ALWAYS:
            continue  # a figure the run never asks for (frames, sustained runs without deploy.frame/sustained)
        lines.append(f"| {label} | {_value(row.get(key), fmt, unit)} | {_value(teacher.get(key), fmt, unit)} |")
    drops = card.get("per_class_drops") or []
    if drops:
        lines += ["", f"Classes whose {metric} fell most against the teacher: "
                  + ", ".join(f"{d['class']} (lost {d['drop_points']:.1f} points)" for d in drops) + "."]
    if card.get("verdict"):
        lines += ["", f"**Shipped with --force: the report judged this rung unfit ({card['verdict']}).**"]
    if card.get("precision_ran"):
        lines += ["", f"Precision: {card['precision_ran']}."]
    if card.get("flags"):
        lines += ["", "What the report flagged on these figures:", ""] + [f"- {flag}" for flag in card["flags"]]
    measured = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in under.items() if v is not None and k != "device")
    lines += ["", f"Measured on {under['device']}: {measured}.", ""]
    if card.get("power_setting") and card["power_setting"].get("text"):
        lines += [f"Power setting (deploy.latency_budget_ms over the sweep): {card['power_setting']['text']}", ""]
    engine = card["engine"]
    if engine.get("file"):
        lines += [f"The engine (`engine/{engine['file']}`) runs only on the device fingerprint in `engine/build.json` "
                  f"({engine.get('fingerprint_text')}) and loads only in a Triton built on the same TensorRT "
                  f"({engine.get('tensorrt')}). To rebuild it on another device:", "",
                  f"    {engine.get('trtexec')}", ""]
    else:
        lines += [f"No engine is shipped: {engine.get('why')}. Build it on the device:", "",
                  f"    {engine.get('trtexec')}", ""]
    ds = card["deepstream"]
    host = ds.get("host_accuracy")
    against = (f"against {100 * host:.2f} as EdgeFold fed it on the same host" if host is not None
               else "(the host did not score the rung under EdgeFold's own feed)")
    notes = " ".join(note.rstrip(".") + "." for note in ds.get("notes", []))
    lines += [f"DeepStream's `nvinfer` scales the whole frame to the network's size: {metric} under that "
              f"preprocessing {ds['accuracy_text']}, {against} ({ds['images']} test images, ONNX Runtime); on the "
              f"device, as EdgeFold fed it: {accuracy(row)}. {notes}".rstrip(), ""]
    lines += _nvinfer_engine(ds, under["device"])
    if card.get("check"):
        lines += ["## Checked (edgefold ship --check)", "", check_text(card["check"], metric), ""]
    return "\n".join(lines)


def check_text(record: dict[str, Any], metric: str) -> str:
    """The check in one paragraph (the log line, and card.md's)."""
    verdict = "passed" if record["passed"] else "FAILED"
    ratio = (f"; its network call {record['network_ms_per_image']:.3f} ms per image against the agent's "
             f"{record['agent_ms_per_image']:.3f} ms on {record['device']}: ×{record['time_ratio']:.2f}"
             if record.get("time_ratio") else "")
    if record["passed"]:
        against = f"equal to {record['expected_is']}"
    elif record.get("expected") is None:
        against = f"and the card has no figure to set it against ({record['expected_is']}: not measured)"
    else:
        against = f"where {record['expected_is']} is {100 * record['expected']:.2f}"
    return (f"check {verdict}: infer.py run from another directory ({record['python']}, {record['runtime']}, on "
            f"{record['ran_on']}) scored {metric} {100 * record['score']:.2f} on {record['images']} test images, "
            f"{against}{ratio}; from the file to the answer {record['whole_ms_per_image']:.3f} ms per image "
            f"({record['date']})")


def _nvinfer_engine(ds: dict[str, Any], device: str) -> list[str]:
    """card.md's lines on the engine nvinfer runs: the timed one, where it is shipped; else how it was timed, the line
    that builds it, and what nvinfer would build by itself."""
    plan, form = ds.get("plan") or {}, ds.get("form") or {}
    changes = "; ".join(ds.get("graph_changes") or [])
    timing = ""
    if form.get("state") == "succeeded":
        ratio = form.get("vs_rung") or {}
        paired = (f", ×{ratio['ratio']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}] the rung's p50 over "
                  f"{ratio['rounds']} paired rounds" if ratio else "")
        timing = (f"measured on {device} as a form of this rung ({form.get('runtime')}, batch {form.get('batch')}): "
                  f"p50 {form['latency_p50_ms']:.3f} ms{paired}")
    if plan.get("timed") == "as the rung itself":
        return [f"`nvinfer` runs `engine/engine.plan`, the engine that was timed: its graph is the rung's.", ""]
    if plan:
        return [f"`nvinfer` runs `deepstream/model.plan`, the engine the agent built and timed for the DeepStream "
                f"graph ({changes}), {timing} (`deepstream/build.json`). To rebuild it on another device:", "",
                f"    {ds['trtexec']}", ""]
    if not ds.get("trtexec"):
        return []
    said = (f"The DeepStream graph ({changes or 'no engine came from the device'}) was {timing}, but no engine of it "
            "came (its runtime builds none, or the agent no longer holds it)" if timing else
            f"The DeepStream graph is not the measured one ({changes or 'no engine came from the device'}) and was not "
            "measured as a form of the rung (a run deployed with deploy.nvinfer off, or before it existed)")
    fallback = ("Until `deepstream/model.plan` exists, `nvinfer` builds its own engine from `onnx-file` with its own "
                "options and saves it under a generated name: an engine nobody timed")
    if ds.get("precision") == "int8":
        fallback += (" — and for `network-mode=1` with no `int8-calib-file`, DeepStream's builder logs \"INT8 "
                     "calibration file not specified. Trying FP16 mode.\" and builds FP16, so neither its time nor "
                     "its accuracy is this card's")
    return [f"{said}. Build `deepstream/model.plan` on the device with the options the measured engine was built "
            f"with:", "", f"    {ds['trtexec']}", "", f"{fallback}.", ""]


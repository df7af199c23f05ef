"""The graph DeepStream's ``nvinfer`` runs, measured on the device as a form of each rung.

A classifier's or segmenter's ``nvinfer`` graph is not the rung's: it ends in a Softmax (``nvinfer``'s parsers
threshold probabilities) and, where the standard deviation differs per channel, starts with a Mul by 1/std
(``nvinfer`` scales every channel alike; :mod:`pipeline.ship.deepstream`). An engine built from the rung is then not
the engine ``nvinfer`` runs, and one ``nvinfer`` builds itself from the ONNX file is built with its own options (for
INT8 without a calibration file, FP16: DeepStream 6.x's builder). So the deploy stage writes that graph
(``deploy/nvinfer-<rung>.onnx``) and measures it in the same interleaved rounds, right after its rung, with the rung's
job less the scoring: its engine stays in the agent's cache for ``edgefold ship`` to fetch, and its time is a ratio
to the rung's, paired by round. A rung whose ``nvinfer`` graph is its own (a detector's raw tensors) has no form.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.deploy.hooks import Job, Windows

ROAD = "nvinfer"


@dataclass(frozen=True)
class Form:
    """A rung's ``nvinfer`` graph and how it differs from the rung's."""

    path: Path
    changes: tuple[str, ...]


def write_forms(ship, run_dir: Path, artifacts: dict[str, Path], workdir: Path,
                log=lambda text: None) -> dict[str, Form]:
    """Each rung's ``nvinfer`` graph where it differs from the rung's, written into ``workdir``. A graph that cannot
    be written (an output that is not float32, a graph the ONNX checker refuses) is left unmeasured, said in the log:
    the rung itself is measured as ever, and ``edgefold ship`` says the DeepStream graph was not timed.

    Args:
        ship: The task's :class:`pipeline.ship.task.ShipTask` (its preprocessing and whether a Softmax ends the graph);
            None: the task ships nothing, so no form.
    """
    from pipeline.ship.deepstream import deepstream_model, normalization

    if ship is None:
        return {}
    _, _, per_channel = normalization(ship.preprocess(run_dir))
    forms = {}
    for rung, path in artifacts.items():
        target = workdir / f"nvinfer-{rung}.onnx"
        try:
            changes = deepstream_model(path, target, per_channel, ship.softmax())["changes"]
        except Exception as err:  # noqa: BLE001 — the onnx checker's errors have no common base; the rung goes on
            log(f"{rung}: the graph nvinfer runs could not be written ({type(err).__name__}: {err}); it is not timed")
            target.unlink(missing_ok=True)
            continue
        if changes:
            forms[rung] = Form(target, tuple(changes))
        else:
            target.unlink()
    return forms


def with_forms(windows: Windows, forms: dict[str, Form]) -> Windows:
    """``windows`` with each form's job right after its rung's in every round, as the rung's job (its precision, runtime
    and options) on the form's file at its smallest batch, less what only the rung answers (the scoring, the frame,
    the sweep, the per-layer profile)."""
    if not forms:
        return windows
    jobs = []
    for job in windows.jobs:
        jobs.append(job)
        if job.road == "tensorrt" and job.rung in forms:
            jobs.append(Job(job.rung, forms[job.rung].path, ROAD))

    def spec(job: Job, round_index: int):
        if job.road != ROAD:
            return windows.spec(job, round_index)
        rung_job = windows.spec(Job(job.rung, job.path), round_index)  # the task's job, its artifact the form's
        # At the smallest batch alone: the one a rung ships at (its latency batch) and nvinfer's batch-size.
        return rung_job.model_copy(update={"evaluation": None, "frame": None, "sweep": None, "profile": False,
                                           "batch_sizes": [min(rung_job.batch_sizes)],
                                           "label": f"{rung_job.label[:180]}/nvinfer"})

    def announce(job: Job, round_index: int):
        if job.road == ROAD:
            return f"{job.shown} round {round_index + 1} (the graph DeepStream's nvinfer runs)"
        return windows.announce(job, round_index)

    return Windows(jobs, spec, announce)


def _p50(record: dict[str, Any], batch: int) -> float | None:
    if record.get("state") != "succeeded":
        return None
    return next((run["latency_p50_ms"] for run in record["result"]["runs"] if run["batch_size"] == batch), None)


def form_records(forms: dict[str, Form], rounds: dict[Job, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each form's record: its file, its engines in the agent's cache, its p50 and its ratio to the rung's p50 over
    the rounds both were measured in (paired: a busy spell hits both), or why it was not measured."""
    import numpy as np

    from device.files import sha256_file
    from pipeline.stats import ratio_interval, significant

    rung_rounds = {job.rung: records for job, records in rounds.items() if job.road == "tensorrt"}
    found = {}
    for job, records in rounds.items():
        if job.road != ROAD:
            continue
        form = forms[job.rung]
        entry: dict[str, Any] = {"file": form.path.name, "sha256": sha256_file(form.path), "changes": list(form.changes)}
        measured = [r for r in records if r.get("state") == "succeeded"]
        if not measured:
            entry.update(state="failed", error=next((r.get("error") for r in records if r.get("error")),
                                                    "no window of it ran"))
            found[job.rung] = entry
            continue
        result = measured[0]["result"]
        batch = min(run["batch_size"] for run in result["runs"])
        mine = [_p50(r, batch) for r in records]
        theirs = [_p50(r, batch) for r in rung_rounds.get(job.rung, [])]
        ratio, low, high = ratio_interval(mine, theirs)
        built = result["runtime"].get("built") or {}
        entry.update(state="succeeded", batch=batch, runtime=result["runtime"]["name"],
                     precision=result["runtime"]["precision"],
                     latency_p50_ms=float(np.median([m for m in mine if m is not None])),
                     windows_ms=mine, rung_windows_ms=theirs,
                     vs_rung=None if not np.isfinite(ratio) else
                     {"ratio": ratio, "low": low, "high": high, "significant": significant(low, high),
                      "rounds": sum(a is not None and b is not None for a, b in zip(mine, theirs))},
                     engines=built.get("engines") or None)
        found[job.rung] = entry
    return found

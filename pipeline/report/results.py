"""One versioned results document per run, whatever its task: ``results.json`` (every figure of the report, with
the schema and the task) and ``results.csv`` (one row per rung × device), and the report folder's atomic rebuild.

The measured fields a row carries beyond the task's own columns are declared once, on the result schema
(:func:`device.reported.reported`): their label, format, how a rung's windows combine (a median over the interleaved
rounds with its interval, a peak, a low), at which batch size, and since when a result has them. A new field declared
there reaches both tasks' results, CSV and ladder tables with no edit here or in a task.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from device.files import sha256_file
from device.reported import Reported, reported_fields
from device.schema import DeviceTiming, JobResult, RunResult, RunSummary
from pipeline import stats
from pipeline.core.manifest import Manifest

RESULTS_SCHEMA = "edgefold.results/4"  # 4: detection's network_p50_* columns are the declared latency_p50_*
def _declared(*sources: dict[str, Reported]) -> dict[str, Reported]:
    """The declared fields of every model, by row column; two fields that claim one column are a schema bug."""
    merged: dict[str, Reported] = {}
    for fields in sources:
        for column, how in fields.items():
            keys = (column, *(how.interval or ()), *((how.windows,) if how.windows else ()))
            taken = {key for other, known in merged.items()
                     for key in (other, *(known.interval or ()), *((known.windows,) if known.windows else ()))}
            if taken & set(keys):
                raise TypeError(f"{'.'.join(how.path)} declares row keys {sorted(taken & set(keys))} that another "
                                "declared field has: give it a column= of its own")
            merged[column] = how
    return merged


REPORTED: dict[str, Reported] = _declared(reported_fields(RunResult), reported_fields(DeviceTiming, ("device_timing",)),
                                          reported_fields(RunSummary, ("summary",)))
"""Every declared measured field, keyed by its row column, in the order the tables and the CSV show them."""
NOT_RECORDED = "not recorded"


def _read(run: Any, path: tuple[str, ...]) -> float | None:
    """The value at ``path`` in a window's result; None where the window lacks it or it is no number (NaN)."""
    for name in path:
        run = getattr(run, name, None) if run is not None else None
    return run if isinstance(run, (int, float)) and run == run else None


def reported_figures(rounds: Iterable[JobResult], latency_batch: int | None = None,
                     throughput_batch: int | None = None) -> dict[str, Any]:
    """Each declared measured field of one rung, from its interleaved rounds: a median over the rounds' windows of
    its batch size (with the interval and the per-round values it declares), or a peak's max and a low's min over
    every window; ``not_recorded``: the fields some round's result is too old to carry (a rung reused from the
    deploy cache), shown as "not recorded", never as zero.

    Args:
        rounds: The rung's results, one per interleaved round.
        latency_batch: The batch size of the ``latency`` fields (default: the smallest the rounds timed).
        throughput_batch: That of the ``throughput`` fields (default: the largest).
    """
    rounds = list(rounds)
    batches = sorted({run.batch_size for result in rounds for run in result.runs})
    chosen = {"latency": latency_batch if latency_batch is not None else (batches[0] if batches else None),
              "throughput": throughput_batch if throughput_batch is not None else (batches[-1] if batches else None)}
    out: dict[str, Any] = {"not_recorded": []}
    for column, how in REPORTED.items():
        keys = (column, *(how.interval or ()), *((how.windows,) if how.windows else ()))
        if any(result.minor < how.since for result in rounds):
            out.update(dict.fromkeys(keys))
            if how.windows:  # still one entry per round: the ratios pair rounds by position
                out[how.windows] = [None] * len(rounds)
            out["not_recorded"].append(column)
            continue
        if how.batch == "every":
            windows = [run for result in rounds for run in result.runs]
        else:
            windows = [result.run(chosen[how.batch]) for result in rounds]
        values = [None if (value := _read(run, how.path)) is None else value * how.scale for run in windows]
        present = [value for value in values if value is not None]
        if how.combine != "median":
            out[column] = (max if how.combine == "max" else min)(present) if present else None
            continue
        estimate = stats.median_interval(present) if present else (None, None, None)
        out[column] = estimate[0]
        if how.interval:
            out.update(zip(how.interval, estimate[1:]))
        if how.windows:
            out[how.windows] = values
    return out


def interval_cell(value: float | None, low: float | None, high: float | None, spec: str) -> str:
    """``4.020 [3.950, 4.110]``; the bare value when there is no interval (one window); — when no value."""
    if value is None:
        return "—"
    if low is None or high is None or low == high:
        return format(value, spec)
    return f"{format(value, spec)} [{format(low, spec)}, {format(high, spec)}]"


def ladder_columns() -> list[str]:
    """The declared fields every task's ladder shows beside its own columns, with their intervals."""
    return [column for column, how in REPORTED.items() if how.ladder]


def detail_columns(exclude: Iterable[str] = ()) -> list[str]:
    """The declared fields the ladder's detail shows (the others, less ``exclude``: shown in a table of their own)."""
    exclude = set(exclude)
    return [column for column, how in REPORTED.items() if not how.ladder and column not in exclude]


def figure_label(column: str, with_interval: bool = False) -> str:
    """A declared field's column header (``p50 ms [95% CI]`` where the cell shows its interval)."""
    how = REPORTED[column]
    return how.label + (" [95% CI]" if with_interval and how.interval else "")


def figure_cell(row: dict[str, Any], column: str, missing: str = "—", with_interval: bool = False) -> str:
    """A declared field's cell in its declared format: "not recorded" where the row's result is too old to carry
    it, ``missing`` where it was not measured, the interval after it when asked and known."""
    how = REPORTED[column]
    if column in (row.get("not_recorded") or []):
        return NOT_RECORDED
    if row.get(column) is None:
        return missing
    low, high = (row.get(key) for key in how.interval) if with_interval and how.interval else (None, None)
    return interval_cell(row[column], low, high, how.fmt)


def csv_columns(task_columns: Sequence[str]) -> tuple[str, ...]:
    """A task's own columns, then every declared measured field with its interval's bounds, then ``not_recorded``."""
    declared = [key for column, how in REPORTED.items() for key in (column, *(how.interval or ()))]
    return (*task_columns, *(key for key in declared if key not in task_columns), "not_recorded")


def write_results(out: Path, document: dict[str, Any], task: str, task_columns: Sequence[str]) -> dict[str, Path]:
    """Writes ``results.json`` (``document`` with the schema and task first) and ``results.csv`` (its ``rows``).

    Args:
        out: The report folder.
        document: Every figure of the report; ``rows`` is a list of flat dicts, one per rung × device.
        task: The task's name.
        task_columns: The task's own CSV columns, in order.

    Returns:
        ``{"json": …, "csv": …}``.
    """
    paths = {"json": out / "results.json", "csv": out / "results.csv"}
    document = {"schema": RESULTS_SCHEMA, "task": task, **{k: v for k, v in document.items() if k != "schema"}}
    paths["json"].write_text(json.dumps(document, indent=1) + "\n")  # no default=str: a non-JSON value is a bug
    columns = csv_columns(task_columns)
    with open(paths["csv"], "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in document["rows"]:
            writer.writerow({k: ("" if row.get(k) is None else "; ".join(map(str, row[k])) if isinstance(row[k], list)
                                 else row[k]) for k in columns})
    return paths


def rebuild_report(run_dir: str | Path, build: Callable[[Path, Path], dict[str, Path]]) -> dict[str, Path]:
    """Rebuilds a run's ``report/`` folder whole (``edgefold report RUN``) and keeps the manifest's record of it true.

    The files are rendered into a folder beside ``report/`` that takes its place only once all of
    them were written: a failure (a plot, a full disk) leaves the previous report as it was, never
    new JSON beside old HTML. When the report stage recorded these files, the manifest's sha256 of
    them (and the headline) are updated: a rebuild had made them false, so the next run redid the
    stage and no recorded hash could be checked.

    Args:
        run_dir: The run.
        build: Writes the report's files of ``run_dir`` into a folder (the task's ``build_report``).

    Returns:
        The paths of the files written in ``report/``.
    """
    run_dir = Path(run_dir)
    final = run_dir / "report"
    # mkdir, not mkdtemp: the folder becomes report/ and keeps the umask's permissions, not 0700.
    staging = run_dir / f".report.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial"
    staging.mkdir()
    try:
        built = build(run_dir, staging)
        # Two renames: no call replaces a folder that holds files. Between them the old report waits
        # whole in .report.*.old (a crash there loses nothing).
        old = staging.with_suffix(".old") if final.exists() else None
        if old is not None:
            os.rename(final, old)
        try:
            os.rename(staging, final)
        except BaseException:
            if old is not None:
                os.rename(old, final)
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    paths = {kind: final / path.name for kind, path in built.items()}
    _record_rebuild(run_dir, paths)
    return paths


def _record_rebuild(run_dir: Path, paths: dict[str, Path]) -> None:
    """Updates the report stage's entry in the manifest to the rebuilt files (nothing if it never ran here)."""
    manifest = Manifest.load(run_dir)
    entry = manifest.stage("report")
    if not entry:
        return
    # The rebuilt files are the stage's outputs now (a run reported by an older version named other files).
    outputs = {kind: str(path.relative_to(run_dir)) for kind, path in paths.items()}
    entry["outputs"] = outputs
    entry["sha256"] = {rel: sha256_file(run_dir / rel) for rel in outputs.values()}
    headline = json.loads(paths["json"].read_text()).get("headline")
    if headline is not None:
        entry.setdefault("metrics", {})["headline"] = headline
    entry["rebuilt"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    manifest.save()

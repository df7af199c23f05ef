"""One versioned results document per run, whatever its task: ``results.json`` (every figure of the report, with
the schema and the task) and ``results.csv`` (one row per rung × device), and the report folder's atomic rebuild.

The measured fields a row carries beyond the task's own columns are declared once, on the result schema
(:func:`device.schema.reported`): their label, format, how a rung's windows combine and since when a result has
them. A new field declared there reaches both tasks' CSV and ladder detail with no edit here.
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
from device.reported import reported_fields
from device.schema import JobResult, RunSummary
from pipeline.core.manifest import Manifest

RESULTS_SCHEMA = "edgefold.results/3"
REPORTED = reported_fields(RunSummary)
NOT_RECORDED = "not recorded"


def reported_figures(rounds: Iterable[JobResult]) -> dict[str, Any]:
    """Each measured field the schema declares for the report, over every window of every batch size
    (``combine``: a peak's max, a low's min), and ``not_recorded``: the fields some window's result is
    too old to carry (a rung reused from the deploy cache), shown as "not recorded", never as zero."""
    rounds = list(rounds)
    out: dict[str, Any] = {"not_recorded": []}
    for name, how in REPORTED.items():
        if any(result.minor < how.since for result in rounds):
            out[name] = None
            out["not_recorded"].append(name)
            continue
        values = [value for result in rounds for run in result.runs
                  if (value := getattr(run.summary, name)) is not None and value == value]
        out[name] = (max if how.combine == "max" else min)(values) if values else None
    return out


def csv_columns(task_columns: Sequence[str]) -> tuple[str, ...]:
    """A task's own columns, then every declared measured field, then ``not_recorded``."""
    return (*task_columns, *(name for name in REPORTED if name not in task_columns), "not_recorded")


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

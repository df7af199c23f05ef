"""The tasks, one package each (``classification``, ``detection``, ``segmentation``), each declaring a
:class:`~pipeline.core.task.Task` as ``TASK``. A task never imports another task.

A task package is imported only when a run of that task asks for it (:func:`get`), so that one task's code never
enters another's stages' code hashes (:mod:`pipeline.core.codehash`).
"""

from __future__ import annotations

import difflib
import importlib
import json
from pathlib import Path

from device.errors import ConfigError
from pipeline.core.task import Task

TASK_NAMES = ("classification", "detection", "segmentation")


def get(name: str) -> Task:
    """The task registered under ``name``.

    Raises:
        ConfigError: An unknown task, with the nearest name.
    """
    if name not in TASK_NAMES:
        near = difflib.get_close_matches(str(name), TASK_NAMES, n=1, cutoff=0.5)
        raise ConfigError(f"task {name!r} is unknown", fix=(f"did you mean {near[0]!r}? " if near else "")
                          + f"tasks: {', '.join(TASK_NAMES)}")
    return importlib.import_module(f"pipeline.tasks.{name}").TASK


def of_run(run_dir: Path) -> Task:
    """The task of a run, from its manifest (a run from before the manifest named its task: detection when its
    evaluate stage recorded a ``ladder``)."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    except (OSError, ValueError):
        return get("classification")
    return of_manifest(manifest)


def of_manifest(manifest: dict) -> Task:
    """The task of a run from its manifest's data (:func:`of_run` without reading the file again)."""
    if manifest.get("task"):
        return get(manifest["task"])
    evaluated = ((manifest.get("stages") or {}).get("evaluate") or {}).get("outputs", {})
    return get("detection" if "ladder" in evaluated else "classification")

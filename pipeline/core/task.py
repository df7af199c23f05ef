"""The one interface a task declares (:data:`pipeline.tasks.classification.TASK`, ``…detection.TASK``).

The runner, the CLI and ``edgefold report`` take a :class:`Task` and never ask which one it is: the task names its
stages, its score, how a finished run's report is built and what ``edgefold run`` prints at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from device.registry import Registry
from pipeline.core.stage import Stage

if TYPE_CHECKING:
    from pipeline.core.context import RunContext


@dataclass(frozen=True)
class Task:
    """A task's declared interface.

    Attributes:
        name: The recipe's ``task`` value.
        stages: The task's stages by name; :data:`~pipeline.core.stage.STAGE_ORDER` gives their order.
        build_report: Writes the report's files of a finished run (``run_dir``) into a folder; returns their paths
            (``md``, ``html``, ``json``, ``csv`` at least: every task writes ``results.json`` and ``results.csv``).
        summary: Prints the end of ``edgefold run`` (the ladder, the headline, where the report is).
        headline: The headline of a built report's ``results.json`` (its ``headline`` object) in words.
        ship: What ``edgefold ship`` asks of the task (:class:`pipeline.ship.task.ShipTask`); None where it cannot ship.
        score: The key of the task's score in a stage's metrics (``top1``, ``map``), a fraction.
        score_name: That score in words (``top-1``, ``mAP``), for listings and logs.
        deploys_again: The CLI commands that deploy a finished run again with deploy keys of their own (``sustain``:
            ``deploy.sustained``; ``sweep``: ``deploy.sweep``); the others are refused up front with the reason.
    """

    name: str
    stages: Registry[Stage]
    build_report: Callable[[Path, Path], dict[str, Path]]
    summary: Callable[["RunContext"], None]
    headline: Callable[[dict], str]
    ship: Any = None
    score: str = "top1"
    score_name: str = "top-1"
    deploys_again: tuple[str, ...] = ("sustain",)


def stage_registry(task: str, stages: list[type[Stage] | Stage]) -> Registry[Stage]:
    """Each stage registered under its name (a duplicate name is refused): a task's own stage class is made here; a
    shared stage (:mod:`pipeline.stages`) comes made, with the task's hooks."""
    registry: Registry[Stage] = Registry(f"{task} stage")
    for entry in stages:
        registry.add(entry.name, entry() if isinstance(entry, type) else entry)
    return registry

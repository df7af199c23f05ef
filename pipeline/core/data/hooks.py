"""What a task gives the data stage written once (:mod:`pipeline.stages.data`): how its source is read, checked whole
and split. The stage records what every task's later stages and reports read the same way: ``dataset.json`` (the
source and the class names, in label order) and the split sizes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Splits:
    """A task's data, split and written into the stage's folder.

    Attributes:
        source: The source's name as the log and the report say it.
        classes: The class names, in label order.
        outputs: The files written (the splits), by output name.
        metrics: The split sizes (``train`` and ``test`` at least) and whatever else the task checked.
        recorded: More that ``dataset.json`` records for later stages (the preprocessing, a generator's settings).
    """

    source: str
    classes: list[str]
    outputs: dict[str, Path]
    metrics: dict[str, Any]
    recorded: dict[str, Any] = field(default_factory=dict)


class DataHooks(ABC):
    """A task's part of the data stage."""

    def keys(self, ctx) -> dict[str, Any]:
        """What decides the splits beyond the recipe's data section (the source's fingerprint, its files' bytes)."""
        return {}

    @abstractmethod
    def split(self, ctx, workdir: Path) -> Splits:
        """Reads the recipe's source, checks it whole before any training (every bad item named) and writes its
        splits into ``workdir``, deterministically from ``data.seed``.

        Raises:
            DataError: A source that is missing, empty or broken, with the fix.
        """

    @abstractmethod
    def summary(self, metrics: dict[str, Any]) -> str:
        """The stage's console line."""

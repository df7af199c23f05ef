"""What a task gives the export stage written once (:mod:`pipeline.stages.export`).

The stage is the same sequence for every task: each rung's checkpoint written as ONNX and checked against torch on
test images (the export refused past the recipe's tolerance), or the user's ONNX file (``start``) written in the
ladder's form as the student and checked against the given graph; then the forms derived from the exported graphs.
A task says how its networks are written and what "the same outputs" means for them (:class:`ExportHooks`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Exported:
    """What the stage wrote: files by output name, and each rung's facts (its graph, its parity, its scores)."""

    outputs: dict[str, Path] = field(default_factory=dict)
    rungs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, other: "Exported") -> None:
        """Takes ``other``'s files and rungs in (a rung exported twice is a task's mistake)."""
        if set(other.rungs) & set(self.rungs):
            raise ValueError(f"rungs exported twice: {sorted(set(other.rungs) & set(self.rungs))}")
        self.outputs.update(other.outputs)
        self.rungs.update(other.rungs)


class ExportHooks(ABC):
    """A task's part of the export stage."""

    def keys(self, ctx) -> dict[str, Any]:
        """What decides the exported graphs beyond the recipe's export section, torch's version and a start's bytes."""
        return {}

    @abstractmethod
    def inspect_start(self, ctx) -> None:
        """Checks the recipe's ONNX start before any stage runs (its layout, operators and outputs against the data).

        Raises:
            EdgeFoldError: A file that is not such a model, with what to change.
        """

    @abstractmethod
    def rungs(self, ctx) -> dict[str, str]:
        """The rungs exported from checkpoints: rung → the stage whose checkpoint it is."""

    @abstractmethod
    def probe(self, ctx) -> Any:
        """The test inputs the parity checks run on (read once for every rung)."""

    @abstractmethod
    def export(self, ctx, rung: str, stage: str, workdir: Path, probe: Any) -> Exported:
        """Writes ``rung`` (``stage``'s checkpoint) as ONNX and checks it against torch on ``probe``.

        Raises:
            StageError: The graph's outputs are past the recipe's tolerance of torch's.
        """

    @abstractmethod
    def started(self, ctx, workdir: Path, probe: Any) -> Exported:
        """The ONNX start's graph as the ``student`` rung: checked again (the file may have changed since the
        preflight), written in the ladder's form, compared with the given graph and scored on the test split."""

    def finish(self, ctx, workdir: Path, exported: Exported) -> None:
        """Adds the forms derived from the exported graphs (FP16) and the files the device needs, in place."""

    @abstractmethod
    def summary(self, metrics: dict[str, Any]) -> str:
        """The stage's console line."""

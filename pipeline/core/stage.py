"""The common base of every stage: inputs checked, outputs hashed and recorded.

A stage only implements :meth:`Stage.config` (what it depends on, hashed for caching),
:meth:`Stage.needs` (earlier stages whose outputs it reads) and :meth:`Stage.run` (its work,
writing into its own folder). :func:`pipeline.runner.run_pipeline` does the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar


if TYPE_CHECKING:
    from pipeline.core.context import RunContext


@dataclass
class StageResult:
    """What a stage produced: output files (absolute paths under its folder) and metrics."""

    outputs: dict[str, Path]
    metrics: dict[str, Any] = field(default_factory=dict)


class Stage:
    """Base class of the pipeline stages."""

    name: ClassVar[str]
    # A stage whose inputs include the outside world (the devices) runs every time and reuses what it can.
    always_run: ClassVar[bool] = False
    # Runs on every rank under torchrun (a DDP training stage); other stages run on rank 0 alone.
    distributed: ClassVar[bool] = False
    # Project modules the stage runs without importing them (a subprocess): part of its code hash.
    code_modules: ClassVar[tuple[str, ...]] = ()

    def preflight(self, ctx: "RunContext") -> None:
        """Checks that need the recipe but no earlier stage's output, run for every stage before the
        first one starts: a mistake is reported before an hour of training, not after."""

    def absent(self, ctx: "RunContext") -> str | None:
        """Why the stage takes no part in this run's ladder (an ONNX start has no PyTorch teacher to train), in
        words the run's log prints; None when it runs."""
        return None

    def code_roots(self, ctx: "RunContext") -> tuple[str, ...]:
        """Modules the stage runs in this run's configuration beyond its own imports (those it loads by name
        for one mode only, so that the other modes' code hashes leave them out)."""
        return ()

    def needs(self, ctx: "RunContext") -> tuple[str, ...]:
        """Earlier stages whose recorded outputs this stage reads."""
        return ()

    def config(self, ctx: "RunContext") -> dict[str, Any]:
        """Everything besides its input files that determines this stage's result."""
        raise NotImplementedError

    def run(self, ctx: "RunContext", workdir: Path) -> StageResult:
        """Does the work, writing outputs into ``workdir``."""
        raise NotImplementedError

    def summary(self, metrics: dict[str, Any]) -> str:
        """One line for the console after the stage ran or was skipped."""
        return ""


class HookedStage(Stage):
    """A stage written once for every task (:mod:`pipeline.stages`), over the hooks the task supplies when it declares
    the stage.

    Args:
        hooks: The task's part; the stage calls it and never imports the task.
    """

    def __init__(self, hooks: Any):
        self.hooks = hooks
        # The task's part runs here without the stage's module importing it: it is part of the stage's code hash.
        self.code_modules = (type(hooks).__module__,)


# The order stages run in; `--until` and `--force` take these names.
STAGE_ORDER = ("data", "teacher", "prune", "distill", "export", "quantize", "evaluate", "deploy", "report")


def started_without_torch(recipe) -> str | None:
    """Why a stage that needs the PyTorch model (teacher, prune, distill) is not in a run that starts from an ONNX
    file (any task's ``start``); None for a recipe with a teacher."""
    start = getattr(recipe, "start", None)
    return (f"the ladder starts at export from {start.onnx} (no PyTorch model to train, prune or distill)"
            if start is not None else None)

"""What a task gives the model stages written once: teacher, prune and distill (:mod:`pipeline.stages.teacher`,
:mod:`pipeline.stages.prune`, :mod:`pipeline.stages.distill`).

They are the same sequence for every task: seed, start from a model (built, loaded from the user's weights or from
the stage before), prune it or train it on the data (with the teacher, for distillation), score it with its interval
on the test split, save it as state (never a pickled module) and record its size and history. A task says only how
each of those steps is done for its models (:class:`ModelHooks`, :class:`PruneHooks`, :class:`DistillHooks`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass
class Start:
    """The model a training stage starts from.

    Attributes:
        model: The ``torch.nn.Module``, on the CPU.
        saved: What the task's :meth:`ModelHooks.save` records beside the state (architecture, classes, input size, …).
        replaced: Head tensors left freshly initialised because the user's weights were for another class count.
        notes: Metrics recorded as they are (a check of the user's weights before training).
    """

    model: Any
    saved: dict[str, Any]
    replaced: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scored:
    """A trained model's scores (the task's score with its interval, a sanity verdict, …) and the files scoring
    wrote (each image's prediction)."""

    metrics: dict[str, Any]
    outputs: dict[str, Path] = field(default_factory=dict)


class ModelHooks(ABC):
    """A task's part of the teacher stage, and what its prune and distill stages share with it (:class:`PruneHooks`,
    :class:`DistillHooks`).

    ``stage`` is ``"teacher"``, ``"prune"`` or ``"distill"`` wherever a hook takes it. The teacher's hooks live in a
    module of their own, apart from pruning and the distillation loss: a stage's code hash is its hooks' module and
    what that imports, so an edit to the loss re-runs distillation and leaves the teacher cached.

    Attributes:
        unkeyed: Per stage, keys of its recipe section that are checks rather than inputs: switching one does not
            train the model again.
    """

    unkeyed: Mapping[str, tuple[str, ...]] = {}

    def check_teacher(self, ctx) -> None:
        """Refuses teacher weights that cannot load, before any stage runs (a wrong file is named before the data
        stage, not after it)."""

    def keys(self, ctx, stage: str) -> dict[str, Any]:
        """What decides the stage's result beyond its recipe section and the weights' bytes."""
        return {}

    @abstractmethod
    def teacher(self, ctx) -> Start:
        """The teacher before training: built, with the recipe's weights loaded where it names some."""

    @abstractmethod
    def checkpoint(self, ctx, stage: str) -> Start:
        """The model an earlier stage saved (eval mode, on the CPU), with what was saved beside it."""

    @abstractmethod
    def train(self, ctx, start: Start, cfg, stage: str, teacher: Any = None) -> list[dict]:
        """Trains ``start.model`` in place with the recipe's ``cfg`` (a ``TrainConfig``) through the shared engine
        (:func:`pipeline.train.engine.fit`); with ``teacher``, distils from it. Returns the per-epoch history."""

    @abstractmethod
    def finish(self, ctx, start: Start, cfg, stage: str, workdir: Path, teacher: Any = None) -> Scored:
        """Scores the trained model on the test split (and whatever the task does after training first); raises
        a :class:`device.errors.StageError` for a model too broken for any later comparison to mean anything."""

    @abstractmethod
    def save(self, path: Path, start: Start) -> Path:
        """Writes ``start.model`` as a checkpoint of state (rank 0 alone under ``torchrun``); returns ``path``."""

    @abstractmethod
    def size(self, ctx, start: Start) -> dict[str, Any]:
        """``params_m`` and ``macs_g`` at the run's input size, with whatever else the task records of size."""

    @abstractmethod
    def summary(self, stage: str, metrics: dict[str, Any]) -> str:
        """The stage's console line."""


class DistillHooks(ModelHooks):
    """A task's part of the distill stage: its student and, in :meth:`ModelHooks.train` given a teacher, its
    distillation loss (under ``torchrun``, on every rank: a loss that runs the student apart from its own forward
    runs the module the training engine wraps in DDP)."""

    def check_student(self, ctx) -> None:
        """Refuses a student that cannot be distilled into, before any stage runs."""

    def from_pruned(self, ctx) -> bool:
        """Whether the student is the prune stage's model (else it is built afresh)."""
        return True

    @abstractmethod
    def student(self, ctx) -> Start:
        """The student before distillation: the pruned teacher, or a smaller architecture built afresh."""


class PruneHooks(ModelHooks):
    """A task's part of the prune stage: how its model is pruned to the recipe's target, and how the pruned model is
    scored before fine-tuning (not gated: a pruned model before distillation is expected to be bad)."""

    def skipped(self, ctx) -> str | None:
        """Why the stage is not in this run (an ONNX start, a recipe without pruning), in the log's words."""
        from pipeline.core.stage import started_without_torch

        return started_without_torch(ctx.recipe)

    def roots(self, ctx) -> tuple[str, ...]:
        """Modules this run's pruning loads by name (one mode's own path), beyond the hooks' imports."""
        return ()

    @abstractmethod
    def prune(self, ctx, start: Start, workdir: Path) -> dict[str, Any]:
        """Prunes ``start.model`` to the recipe's target (fine-tuned between steps where the recipe asks), in place or
        replacing it with the form it was pruned in (folded), recording the plan in ``start.saved``; returns what
        the stage records of it (``macs_fraction`` at least).

        Raises:
            StageError: The target was not reached within the recipe's tolerance (with what bounds it).
        """

    @abstractmethod
    def assess(self, ctx, start: Start, workdir: Path) -> Scored:
        """The pruned model's scores and a sanity verdict in words, recorded, never raised."""


def section_key(ctx, hooks: ModelHooks, stage: str) -> dict[str, Any]:
    """A training stage's key: its recipe section (less the keys that are checks, not inputs) and the task's keys."""
    section = {key: value for key, value in ctx.recipe.section(stage).items()
               if key not in hooks.unkeyed.get(stage, ())}
    return {stage: section, **hooks.keys(ctx, stage)}


def trained_result(ctx, hooks: ModelHooks, stage: str, start: Start, history: list[dict], workdir: Path,
                   teacher: Any = None, **metrics: Any):
    """After training, the same for both training stages: scored (and gated) by the task, saved, its size recorded.

    Returns:
        The stage's :class:`pipeline.core.stage.StageResult`.
    """
    from pipeline.core.stage import StageResult

    scored = hooks.finish(ctx, start, getattr(ctx.recipe, stage).train, stage, workdir, teacher)
    path = hooks.save(workdir / "model.pt", start)
    return StageResult(outputs={"model": path, **scored.outputs},
                       metrics={**scored.metrics, **hooks.size(ctx, start), "history": history, **start.notes,
                                **metrics})


def weights_digest(weights: str | None) -> str | None:
    """The SHA-256 of a weights file the recipe names (its bytes, not its name, decide whether a trained model is
    still valid); None for no weights, a name such as ``imagenet``, or a file that is not there (preflight says so)."""
    if not weights or not Path(weights).is_file():
        return None
    from device.files import sha256_file

    return sha256_file(weights)

"""The ladder's record, one shape for every task, and what a task gives the evaluate stage written once
(:mod:`pipeline.stages.evaluate`).

Every rung was scored where it was made (the teacher and distill stages on the test split, the INT8 rung under ONNX
Runtime, the FP16 forms at export); evaluate gathers those figures instead of scoring any model again. The task says
where its figures are (:class:`EvaluateHooks`); the stage checks every row for the fields all readers take (deploy,
the reports, ship, ``bench/``), compares each rung with the baseline on the task's score and writes ``ladder.json``:

``{"schema", "score", "baseline", "classes", "rungs": {rung: row}}``, a row holding at least :data:`ROW_FIELDS` and
the score (a fraction), and after the stage ``<score>_delta_points`` and ``macs_fraction`` against the baseline.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

LADDER_SCHEMA = 1
ROW_FIELDS = ("precision", "artifact", "size_mb", "macs_g")
"""What every rung's row holds, whatever the task: its precision (``fp32``, ``fp16``, ``int8``), the file the device
is sent or the checkpoint it was scored from (relative to the run), that file's size and the network's GMACs."""
PRECISIONS = ("fp32", "fp16", "int8")


def points(value: float) -> float:
    """A difference in percentage points for display: ``-0.0`` (a zero difference negated) becomes 0.0,
    so a table never prints "−0.00 points"."""
    return round(value, 10) + 0.0


def signed(value: float, digits: int = 2) -> str:
    """A signed difference as text, never "-0.00": a value that rounds to zero at ``digits`` prints "+0.00"."""
    return f"{round(value, digits) + 0.0:+.{digits}f}"


def size_text(megabytes: float) -> str:
    """A file size as a person reads it: "22 KB" below a tenth of a megabyte (where "0.0 MB" said nothing), "0.31 MB"
    below 1 MB, "12.3 MB" above."""
    if megabytes < 0.1:
        return f"{max(1, round(megabytes * 1000))} KB"
    return f"{megabytes:.2f} MB" if megabytes < 1 else f"{megabytes:.1f} MB"


class EvaluateHooks(ABC):
    """A task's part of the evaluate stage.

    Attributes:
        score: The key of the task's score in each row (``top1``, ``map``), a fraction.
    """

    score: str

    @abstractmethod
    def needs(self, ctx) -> tuple[str, ...]:
        """The stages whose records the rows come from (those that ran in this run)."""

    def config(self, ctx) -> dict[str, Any]:
        """What decides the record beyond the stages it reads (a recipe section)."""
        return {}

    @abstractmethod
    def rows(self, ctx) -> dict[str, dict[str, Any]]:
        """Every rung this run made, in the ladder's order, each row with :data:`ROW_FIELDS` and the score."""

    def finish(self, ctx, workdir: Path, rows: dict[str, dict[str, Any]]) -> tuple[dict[str, Path], dict[str, Any]]:
        """What the task adds after the comparison (per-class results, …): more outputs and manifest metrics; it may
        add fields to ``rows``, which are then written."""
        return {}, {}

    def summary(self, metrics: dict[str, Any]) -> str:
        """The stage's line in the log."""
        return ", ".join(f"{name} {100 * row[self.score]:.2f}" for name, row in metrics["rungs"].items()
                         if row.get(self.score) is not None)


def baseline_of(rows: dict[str, dict[str, Any]]) -> str | None:
    """What every rung is compared with: the teacher, or in a run started from the user's ONNX file (no teacher) the
    FP32 student, the given graph."""
    return next((name for name in ("teacher", "student") if name in rows), None)


def check_rows(rows: dict[str, dict[str, Any]], score: str) -> None:
    """Refuses a row that lacks a field every reader takes, or an unknown precision: a task's mistake, named here
    rather than as a ``KeyError`` in a report later."""
    from device.errors import StageError

    fix = "this is a bug in the task's evaluate hooks (pipeline/tasks/<task>/evaluated.py): report it"
    for name, row in rows.items():
        missing = [key for key in (*ROW_FIELDS, score) if key not in row]
        if missing:
            raise StageError(f"evaluate: the {name} row lacks {', '.join(missing)} (every task's row holds "
                             f"{', '.join(ROW_FIELDS)} and its score)", fix=fix)
        if row["precision"] not in PRECISIONS:
            raise StageError(f"evaluate: the {name} row's precision {row['precision']!r} is none of {PRECISIONS}",
                             fix=fix)


def compare(rows: dict[str, dict[str, Any]], score: str, baseline: str | None) -> None:
    """Each row's score difference from the baseline in points (``<score>_delta_points``) and its share of the
    baseline's MACs, in place. Where both rows hold counts of correct answers on the same images
    (``<score>_correct``, ``images``), the difference is of the counts: equal counts are exactly 0 points, never a
    float32 "−0.00"."""
    if baseline is None:
        return
    base = rows[baseline]
    correct = f"{score}_correct"
    for row in rows.values():
        if correct in row and correct in base and row.get("images") == base.get("images"):
            row[f"{score}_delta_points"] = points(100 * (row[correct] - base[correct]) / base["images"])
        elif row[score] is not None and base[score] is not None:
            row[f"{score}_delta_points"] = points(100 * (row[score] - base[score]))
        row["macs_fraction"] = row["macs_g"] / base["macs_g"] if base["macs_g"] else None

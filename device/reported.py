"""How a measured field of the result schema appears in the report, declared once on the field itself.

``power_peak_mw: float | None = reported("…", label="power peak mW", fmt=".0f", combine="max")`` puts the field in
every task's results.json, results.csv and ladder detail (:mod:`pipeline.report.results`): no list to extend elsewhere.
A latency declares how a rung's interleaved windows make one figure (``combine="median"``, at the smallest batch
size, with the row keys of its 95% interval and of its windows, which the paired ratios read).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Reported(BaseModel):
    """How a measured field appears in the report: its column, its format, and how a rung's windows combine.

    Attributes:
        label: The column's header (unit included).
        fmt: Its format spec (``".1f"``).
        combine: How the rung's figure comes from its timed windows: ``max`` for a peak, ``min`` for a low,
            ``median`` over the interleaved rounds (with its bootstrap interval when ``interval`` names its keys).
        batch: Whose windows: ``every`` batch size's, the ``latency`` batch's (the smallest) or the
            ``throughput`` batch's (the largest).
        column: The row's key, when not the field's name (``power_mean_mw`` is shown as ``power_mean_w``).
        scale: Multiplies the value into the column's unit (``0.001`` for mW → W).
        interval: The row keys of the median's 95% interval (low, high).
        windows: The row key of the per-round values the median came from (one per round, None where a round
            lacks it), paired by round in the ratios between rungs.
        ladder: Shown in the ladder's main table (with its interval); the others go to its detail.
        since: The result schema's minor version that added the field: an older result shows "not recorded".
        series: The telemetry series (:mod:`device.telemetry.series`) the summary fills it from, if any.
        stat: Which of that series' window statistics (``peak``, ``low``, ``mean``).
        path: Where the field lives in a window's result (``("summary", "power_peak_mw")``); set by
            :func:`reported_fields`, never declared.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    label: str
    fmt: str
    combine: Literal["max", "min", "median"]
    batch: Literal["every", "latency", "throughput"] = "every"
    column: str | None = None
    scale: float = 1.0
    interval: tuple[str, str] | None = None
    windows: str | None = None
    ladder: bool = False
    since: int = 0
    series: str | None = None
    stat: Literal["peak", "low", "mean"] | None = None
    path: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one_window_per_round(self) -> "Reported":
        # A median pairs rounds: one window each, so one batch size; a peak or a low has no interval to declare.
        if self.combine == "median" and self.batch == "every":
            raise ValueError("combine='median' takes one window per round: declare batch='latency' or 'throughput'")
        if self.combine != "median" and (self.interval or self.windows):
            raise ValueError(f"combine={self.combine!r} has no interval or per-round windows to declare")
        return self


def reported(description: str, default: Any = None, **report: Any) -> Any:
    """A measured field the report shows: ``reported("…", label=, fmt=, combine=, …)``; ``default=...`` for a
    field every result carries."""
    return Field(default, description=description, json_schema_extra={"reported": Reported(**report).model_dump(mode="json")})


def reported_fields(model: type[BaseModel], within: tuple[str, ...] = ()) -> dict[str, Reported]:
    """The fields of ``model`` the report shows, in declaration order, keyed by their column, with how.

    Args:
        model: A result model that declares fields with :func:`reported`.
        within: The attribute path from a window's result (:class:`device.schema.RunResult`) to ``model``.
    """
    fields = {}
    for name, field in model.model_fields.items():
        if isinstance(field.json_schema_extra, dict) and "reported" in field.json_schema_extra:
            how = Reported(**field.json_schema_extra["reported"])
            fields[how.column or name] = how.model_copy(update={"path": (*within, name)})
    return fields

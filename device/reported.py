"""How a measured field of the result schema appears in the report, declared once on the field itself.

``power_peak_mw: float | None = reported("…", label="power peak mW", fmt=".0f", combine="max")`` puts the field in
every task's results.csv and ladder detail (:mod:`pipeline.results`): no list to extend elsewhere.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Reported(BaseModel):
    """How a measured field appears in the report: its column, its format, and how a rung's windows combine.

    Attributes:
        label: The column's header (unit included).
        fmt: Its format spec (``".1f"``).
        combine: How the rung's figure comes from every timed window of every batch size: ``max`` for a
            peak, ``min`` for a low.
        since: The result schema's minor version that added the field: an older result shows "not recorded".
        series: The telemetry series (:mod:`device.telemetry.series`) the summary fills it from, if any.
        stat: Which of that series' window statistics (``peak``, ``low``, ``mean``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    label: str
    fmt: str
    combine: Literal["max", "min"]
    since: int = 0
    series: str | None = None
    stat: Literal["peak", "low", "mean"] | None = None


def reported(description: str, **report: Any) -> Any:
    """A measured field (default None) that the report shows: ``reported("…", label=, fmt=, combine=, …)``."""
    return Field(None, description=description, json_schema_extra={"reported": Reported(**report).model_dump()})


def reported_fields(model: type[BaseModel]) -> dict[str, Reported]:
    """The fields of ``model`` the report shows, in declaration order, with how."""
    return {name: Reported(**field.json_schema_extra["reported"]) for name, field in model.model_fields.items()
            if isinstance(field.json_schema_extra, dict) and "reported" in field.json_schema_extra}

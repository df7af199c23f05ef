"""``deploy.sustained`` on one device, for every task: after the ladder's rounds, one rung run without pause for
minutes (:mod:`device.jobs.sustain`), the board heating under it alone. The task says how its job is asked for; the run,
its reuse and what is recorded when the device cannot take it are the same everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

WAIT_PAST_TIMEOUT_S = 120  # the build host waits this much past the agent's own limit, as for every window


def sustained_run(ctx, artifacts: dict[str, Path], outcome: dict[str, Any], open_session,
                  job_of: Callable[[Any, str, Path], Any]) -> dict[str, Any]:
    """``deploy.sustained``: its rung run without pause on this device, once; reused, like a window, while its
    artifact, the device and the job are unchanged.

    Args:
        artifacts: The run's rungs (what the ladder timed), by name.
        outcome: The device's record so far (its ``status`` and ``error``).
        open_session: A new :class:`pipeline.deploy.session.DeviceSession` of the device.
        job_of: The task's sustained job (:class:`device.schema.JobSpec`, its ``timeout_s`` set) for
            ``(session, rung, path)``.

    Returns:
        ``{"rung", "state", …}``: the window's record, or why the rung was not measured.
    """
    cfg = ctx.recipe.deploy
    rung, path = cfg.sustained.rung, artifacts.get(cfg.sustained.rung)
    if outcome["status"] != "ok" or path is None:
        return {"rung": rung, "state": "not measured",
                "error": outcome.get("error") or f"{rung} has no ONNX artifact in this run"}
    with open_session() as session:
        if not session.open(say_fallback=False):  # said by the ladder's session already
            return {"rung": rung, "state": "not measured", "error": session.outcome["error"]}
        spec = job_of(session, rung, path)
        # Never retried: a retry would run the board for the minutes again (a failure is reported as it is).
        record = session.window(f"{rung} sustained", path, spec, 0, 0, spec.timeout_s + WAIT_PAST_TIMEOUT_S,
                                announce=f"{rung} run without pause for {cfg.sustained.minutes:g} min"
                                         + (" under each sweep setting" if spec.sweep is not None else ""))
    return {"rung": rung, **{k: v for k, v in record.items() if k != "unreachable"}}

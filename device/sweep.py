"""A sweep job's points: each power mode × jetson_clocks state set through jtop, waited for, measured.

Runs inside the job process (:mod:`device.jobrun`) with the runner already loaded: the engine is built
once and every point reuses it. The hold (:mod:`device.power_modes`) is written before the first
change; the original state is restored in a ``finally`` here, and by the agent if this process dies
first. Points that need a reboot, or jetson_clocks on a board without it, are skipped with the
reason; a point that never takes effect is refused with what differed, and not measured.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from device.errors import ConfigError, DeviceError, MissingDependencyError
from device.power_modes import (DeviceHeldError, ModeController, ModeNotSettledError, ModeUnavailableError, PowerMode,
                                PowerModeError, read_hold, read_nvpmodel_conf, write_hold)
from device.schema import NotMeasured, PowerPoint, RunResult, SweepResult, SweepSpec

log = logging.getLogger("edgefold.sweep")
RESTORE_TIMEOUT_S = 60.0

# Measures every batch size of the job under whatever the device runs now, with the given point.
MeasurePoint = Callable[[PowerPoint | None, str], list[RunResult]]


def resolve_modes(wanted: list[str | int] | str, modes: list[PowerMode]) -> list[PowerMode]:
    """The modes a sweep names, in its order (``all``: every mode jtop lists).

    Raises:
        ConfigError: A name or id the board does not have (before anything is changed).
    """
    if wanted == "all":
        return list(modes)
    by_name, by_id = {mode.name: mode for mode in modes}, {mode.id: mode for mode in modes}
    chosen, unknown = [], []
    for ref in wanted:
        mode = by_id.get(ref) if isinstance(ref, int) else by_name.get(ref)
        if mode is None:
            unknown.append(str(ref))
        elif mode not in chosen:
            chosen.append(mode)
    if unknown:
        listed = ", ".join(f"{mode.name} (id {mode.id})" for mode in modes)
        raise ConfigError(f"sweep.power_modes names {', '.join(unknown)}, which this board does not have",
                          fix=f"use the board's modes: {listed}")
    return chosen


def run_sweep(sweep: SweepSpec, job_id: str, hold_path: Path, conf_path: str | None, interval_s: float,
              measure_point: MeasurePoint, progress: Callable[[str], None]) -> tuple[list[RunResult], SweepResult]:
    """Visits every point of ``sweep`` and restores the device.

    Args:
        sweep: The job's sweep.
        job_id: Recorded in the hold (who changed the mode).
        hold_path: The agent's hold file (its data dir).
        conf_path: The board's nvpmodel configuration (the caps each mode must show).
        interval_s: The jtop client's interval: the job's sampling rate (the service's rate is its first client's).
        measure_point: Measures every batch size under the current state.
        progress: Reports where the sweep is.

    Returns:
        (every window measured, the sweep's record).

    Raises:
        DeviceHeldError: Another sweep's hold is still in place.
        ConfigError: The sweep names a mode the board does not have.
        DeviceError: No point could be measured (the device is restored first).
        PowerModeError: The jtop service stopped answering or refused a request (the restore is still tried; the
            agent retries it if it fails).
    """
    try:
        controller = ModeController(interval_s)
        controller.open()
    except MissingDependencyError as err:
        note = f"no power-mode control ({err.message}): measured the current mode only"
        progress("sweep: no power-mode control, measuring the current mode")
        return measure_point(None, "current mode"), SweepResult(controlled=False, note=note)
    with controller:
        held = read_hold(hold_path)
        if held is not None:
            raise DeviceHeldError(f"sweep job {held[0]} still holds the device (its original mode "
                                  f"{held[1].describe()} is not restored)",
                                  fix="restart the agent with the jtop service running: it restores the mode")
        caps = read_nvpmodel_conf(conf_path) if conf_path else {}
        original = controller.state()
        listed = controller.modes()
        disagree = [f"id {mode.id}: jtop {mode.name}, the file {caps[mode.id].name}" for mode in listed
                    if mode.id in caps and caps[mode.id].name != mode.name]
        if disagree:  # jtop numbers modes by their order in nvpmodel's output: another file would check wrong caps
            raise PowerModeError(f"jtop's power modes and {conf_path} disagree ({'; '.join(disagree)})",
                                 fix="point the agent's nvpmodel_conf at the file nvpmodel uses "
                                     "(nvpmodel -p --verbose prints its path)")
        modes = resolve_modes(sweep.power_modes, listed)
        clocks = sweep.jetson_clocks if sweep.jetson_clocks is not None else [None]
        points = [(mode, jc) for mode in modes for jc in clocks]
        runs: list[RunResult] = []
        not_measured: list[NotMeasured] = []
        # The hold goes to disk before the first change: a kill -9 from here on leaves what to restore.
        write_hold(hold_path, job_id, original)
        restored, restore_note = False, None
        try:
            for index, (mode, jc) in enumerate(points, start=1):
                label = f"{mode.name}" + ("" if jc is None else f", jetson_clocks {'on' if jc else 'off'}")
                where = f"point {index}/{len(points)} ({label})"
                try:
                    progress(f"sweep {where}: setting")
                    seen, settle_s = controller.set(mode, jc, caps.get(mode.id), sweep.settle_timeout_s)
                except ModeNotSettledError as err:
                    not_measured.append(NotMeasured(nvpmodel_id=mode.id, nvpmodel_name=mode.name, jetson_clocks=jc,
                                                    kind="refused", reason=err.message))
                    log.warning("sweep %s refused: %s", where, err.message)
                    continue
                except ModeUnavailableError as err:
                    not_measured.append(NotMeasured(nvpmodel_id=mode.id, nvpmodel_name=mode.name, jetson_clocks=jc,
                                                    kind="skipped", reason=err.message))
                    continue
                point = PowerPoint(nvpmodel_id=mode.id, nvpmodel_name=mode.name, jetson_clocks=seen.jetson_clocks,
                                   settle_s=settle_s, **seen.to_point())
                runs += measure_point(point, f"sweep {where}")
        finally:
            try:
                progress("sweep: restoring the original mode")
                controller.restore(original, caps.get(original.nvpmodel_id), RESTORE_TIMEOUT_S)
                hold_path.unlink(missing_ok=True)
                restored, restore_note = True, f"restored {original.describe()}"
            except (PowerModeError, OSError) as err:  # the hold stays: the agent retries and refuses other jobs
                restore_note = f"not restored by the job: {err}"
                log.error("sweep: %s", restore_note)
    if not runs:
        reasons = "; ".join(f"{item.nvpmodel_name}: {item.reason}" for item in not_measured)
        raise DeviceError(f"no point of the sweep could be measured: {reasons}",
                          fix="sweep modes that share the current mode's mask (see each reason)")
    return runs, SweepResult(controlled=True, original=original.to_dict(), restored=restored,
                             restore_note=restore_note, not_measured=not_measured)


def point_facts(static: dict[str, dict[str, Any]], point: PowerPoint | None) -> dict[str, dict[str, Any]]:
    """The samplers' facts with the point's mode and jetson_clocks: those read when jtop opened are the first's."""
    if point is None or "jtop" not in static:
        return static
    return {**static, "jtop": {**static["jtop"], "nvpmodel": point.nvpmodel_name, "jetson_clocks": point.jetson_clocks}}

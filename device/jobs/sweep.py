"""A sweep job's settings: each power mode × jetson_clocks state set through jtop, waited for, measured.

Runs inside the job process (:mod:`device.jobs.jobrun`) with the runner already loaded: the engine is built
once and every setting reuses it. The hold (:mod:`device.power.power_modes`) is written before the first
change; the original state is restored in a ``finally`` here, and by the agent if this process dies
first. Settings that need a reboot, or jetson_clocks on a board without it, are skipped with the
reason; a setting that never takes effect is refused with what differed, and not measured.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from device.errors import ConfigError, EdgeFoldError, MissingDependencyError, NothingMeasuredError, SweepStoppedError
from device.power.power_modes import (DeviceHeldError, ModeController, ModeNotSettledError, ModeUnavailableError, PowerMode,
                                PowerModeError, read_hold, read_nvpmodel_conf, write_hold)
from device.schema import NotMeasured, PowerSetting, SweepResult, SweepSpec
from device.power.setting_schema import SWEEP_RESTORE_S

log = logging.getLogger("edgefold.sweep")
RESTORE_TIMEOUT_S = SWEEP_RESTORE_S

# Measures every batch size of the job under whatever the device runs now, with the given setting (a sustained job:
# its run's record).
MeasurePoint = Callable[[PowerSetting | None, str], list[Any]]


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
              measure_point: MeasurePoint, progress: Callable[[str], None],
              budget: Any = None, jetson: Any = None) -> tuple[list[Any], SweepResult]:
    """Visits every setting of ``sweep`` and restores the device.

    Args:
        sweep: The job's sweep.
        job_id: Recorded in the hold (who changed the mode).
        hold_path: The agent's hold file (its data dir).
        conf_path: The board's nvpmodel configuration (the caps each mode must show).
        interval_s: The jtop client's interval: the job's sampling rate (the service's rate is its first client's).
        measure_point: Measures every batch size under the current state (a sustained job: runs the engine).
        progress: Reports where the sweep is.
        budget: A sustained job's time: ``check(n)`` once the board's settings are known, before any change (raises
            to refuse them); ``late()`` before each setting, a reason to skip it (and the rest) unset, or None.
        jetson: The job's open jtop client (its sampler's), shared rather than a second one; None: one of its own.

    Returns:
        (every window measured, the sweep's record).

    Raises:
        DeviceHeldError: Another sweep's hold is still in place.
        ConfigError: The sweep names a mode the board does not have.
        DeviceError: No setting could be measured (the device is restored first).
        PowerModeError: The jtop service stopped answering or refused a request (the restore is still tried; the
            agent retries it if it fails).
    """
    try:
        controller = ModeController(interval_s, jetson=jetson)
        controller.open()
    except MissingDependencyError as err:
        note = f"no power-mode control ({err.message}): measured the current mode only"
        progress("sweep: no power-mode control, measuring the current mode")
        return measure_point(None, "current mode"), SweepResult(controlled=False, note=note)
    with controller:
        refuse_if_held(hold_path)
        caps = read_nvpmodel_conf(conf_path) if conf_path else {}
        original = controller.state()
        listed = controller.modes()
        _same_modes(listed, caps, conf_path)
        modes = resolve_modes(sweep.power_modes, listed)
        clocks = sweep.jetson_clocks if sweep.jetson_clocks is not None else [None]
        settings = [(mode, jc) for mode in modes for jc in clocks]
        if budget is not None:
            budget.check(len(settings))
        runs: list[Any] = []
        not_measured: list[NotMeasured] = []
        # The hold goes to disk before the first change: a kill -9 from here on leaves what to restore.
        write_hold(hold_path, job_id, original)
        restored, restore_note, where = False, None, "before the first setting"
        try:
            for index, (mode, jc) in enumerate(settings, start=1):
                label = f"{mode.name}" + ("" if jc is None else f", jetson_clocks {'on' if jc else 'off'}")
                where = f"setting {index}/{len(settings)} ({label})"
                try:
                    if budget is not None and (reason := budget.late()):
                        raise ModeUnavailableError(reason)
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
                setting = PowerSetting(nvpmodel_id=mode.id, nvpmodel_name=mode.name, jetson_clocks=seen.jetson_clocks,
                                   settle_s=settle_s, **seen.to_point())
                runs += measure_point(setting, f"sweep {where}")
        except Exception as err:
            # The job's error is all its result keeps: the restore's outcome goes in it, the traceback to the log.
            log.exception("sweep stopped at %s", where)
            restored, restore_note = _restore(controller, original, caps, hold_path, progress)
            raise SweepStoppedError.after(err, where, restore_note) from err
        else:
            restored, restore_note = _restore(controller, original, caps, hold_path, progress)
    return controlled_result(runs, original, restored, restore_note, not_measured,
                             fix="sweep modes that share the current mode's mask (see each reason)")


def controlled_result(runs: list[Any], original: Any, restored: bool, restore_note: str,
                      not_measured: list[NotMeasured], fix: str) -> tuple[list[Any], SweepResult]:
    """A sweep that set what it measured (a Jetson's modes, a GPU's limits): its runs and record.

    Raises:
        NothingMeasuredError: No setting was measured; every skipped one with its reason, and ``fix``.
    """
    if not runs:
        reasons = "; ".join(f"{item.nvpmodel_name}: {item.reason}" for item in not_measured)
        raise NothingMeasuredError(f"no setting of the sweep could be measured: {reasons}", fix=fix)
    return runs, SweepResult(controlled=True, original=original.to_dict(), restored=restored,
                             restore_note=restore_note, not_measured=not_measured)


def refuse_if_held(hold_path: Path, fix: str = "restart the agent with the jtop service running: it restores the "
                                              "mode") -> None:
    """Raises :class:`DeviceHeldError` while another sweep's hold is in place (its original state not restored)."""
    held = read_hold(hold_path)
    if held is not None:
        raise DeviceHeldError(f"sweep job {held[0]} still holds the device (its original state "
                              f"{held[1].describe()} is not restored)", fix=fix)


def _same_modes(listed: list[PowerMode], caps: dict, conf_path: str | None) -> None:
    """jtop numbers modes by their order in nvpmodel's output: another configuration file would check wrong caps.

    Raises:
        PowerModeError: Naming the ids whose names differ.
    """
    disagree = [f"id {mode.id}: jtop {mode.name}, the file {caps[mode.id].name}" for mode in listed
                if mode.id in caps and caps[mode.id].name != mode.name]
    if disagree:
        raise PowerModeError(f"jtop's power modes and {conf_path} disagree ({'; '.join(disagree)})",
                             fix="setting the agent's nvpmodel_conf at the file nvpmodel uses "
                                 "(nvpmodel -p --verbose prints its path)")


def _restore(controller: ModeController, original, caps, hold_path: Path,
             progress: Callable[[str], None]) -> tuple[bool, str]:
    """Restores the mode found before the sweep; (whether it came back, what happened), never raising: the hold
    stays when it did not, and the agent retries it and refuses other jobs until then."""
    try:
        progress("sweep: restoring the original mode")
        controller.restore(original, caps.get(original.nvpmodel_id), RESTORE_TIMEOUT_S)
        hold_path.unlink(missing_ok=True)
        return True, f"restored the original mode {original.describe()}"
    except (PowerModeError, OSError) as err:
        said = err.message if isinstance(err, PowerModeError) else f"{type(err).__name__}: {err}"
        note = (f"the original mode {original.describe()} was not restored by the job ({said}); the agent "
                "restores it from its hold file")
        log.error("sweep: %s", note)
        return False, note


def accelerator_dla_core(accelerator: str, runtime: str) -> int | None:
    """The DLA core a sweep accelerator names (None: the GPU).

    Raises:
        ConfigError: A DLA core asked of a runtime other than TensorRT (ONNX Runtime would run it on the GPU or CPU
            and the result would say DLA).
    """
    if accelerator == "gpu":
        return None
    if runtime != "tensorrt":
        raise ConfigError(f"sweep accelerator {accelerator} needs the TensorRT runtime; this job runs {runtime}",
                          fix="run the job with runtime tensorrt (an agent with TensorRT), or sweep the gpu only")
    return int(accelerator[len("dla"):])


def open_accelerator(accelerator: str, runtime: str, make: Callable[[int | None], Any]) -> tuple[Any, NotMeasured | None]:
    """Loads the runner for one more sweep accelerator (its engines built once, per batch, and kept for every
    setting), or says why it cannot be measured: a DLA the runtime, the TensorRT version or the board lacks.

    Args:
        accelerator: ``gpu``, ``dla0`` or ``dla1``.
        runtime: The job's runtime.
        make: Makes an unloaded runner for a DLA core (None: the GPU).

    Returns:
        (the loaded runner, None), or (None, the accelerator's not-measured record with the reason and its fix).
    """
    runner = None
    try:
        runner = make(accelerator_dla_core(accelerator, runtime))
        runner.load()
    except EdgeFoldError as err:
        if runner is not None:  # a half-built runner (engines, pinned buffers) is freed before the sweep goes on
            runner.close()  # DlaError (no core, a TensorRT without DLA, FP32), an engine that did not build
        reason = err.message + (f" (fix: {err.fix})" if err.fix else "")
        log.warning("sweep: %s not measured: %s", accelerator, reason)
        return None, NotMeasured(nvpmodel_id=None, nvpmodel_name="every setting", jetson_clocks=None, kind="skipped",
                                 reason=reason, accelerator=accelerator)
    return _Loaded(runner), None


class _Loaded:
    """A loaded runner as a context manager that only closes it (ExitStack must not load it twice)."""

    def __init__(self, runner) -> None:
        self.runner = runner

    def __enter__(self):
        return self.runner

    def __exit__(self, *exc) -> None:
        self.runner.close()


def point_facts(static: dict[str, dict[str, Any]], setting: PowerSetting | None) -> dict[str, dict[str, Any]]:
    """The samplers' facts with the setting's mode and jetson_clocks: those read when jtop opened are the first's."""
    if setting is None or setting.nvpmodel_name is None or "jtop" not in static:
        return static
    return {**static, "jtop": {**static["jtop"], "nvpmodel": setting.nvpmodel_name, "jetson_clocks": setting.jetson_clocks}}

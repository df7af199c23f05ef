"""Power limits and locked clocks on a data-center GPU through NVML: the data-center side of a sweep.

Where nvpmodel sets a Jetson's mode, a GPU server's sweep varies NVML's power management limit
(``nvmlDeviceSetPowerManagementLimit``, in mW, within ``nvmlDeviceGetPowerManagementLimitConstraints``) or locks
the graphics clock (``nvmlDeviceSetGpuLockedClocks`` with min = max, within the clocks
``nvmlDeviceGetSupportedGraphicsClocks`` lists; undone by ``nvmlDeviceResetGpuLockedClocks``). Application clocks
are another call and are left alone. Both changes need root: NVML answers ``NVML_ERROR_NO_PERMISSION`` otherwise,
and the sweep then measures the current setting only, saying so.

The GPU is the one the job's runtime uses, found by PCI bus id or UUID like the NVML sampler
(:func:`device.telemetry.nvml.cuda_device_handle`), never by NVML's index, which may name another GPU.

The device is left as found with the Jetson's mechanism (:mod:`device.power.power_modes`): a hold with the original
limit is written before the first change, in the same file, and whoever ends the sweep (the job, the agent after
a cancel, the agent at start-up after a ``kill -9``) restores from it. NVML cannot read whether someone else had
locked the clocks before the sweep, so the restore unlocks them (``nvidia-smi -rgc``'s state).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from device.errors import ConfigError, MissingDependencyError, SweepStoppedError, require
from device.files import write_json_atomic
from device.power.gpu_state import (  # noqa: F401 (the hold's record, re-exported)
    GPU_HOLD_SCHEMA, GpuState, gpu_hold_state)
from device.power.power_modes import Control, PowerModeError
from device.schema import NotMeasured, PowerSetting, SweepResult, SweepSpec
from device.jobs.sweep import MeasurePoint, controlled_result, refuse_if_held

log = logging.getLogger("edgefold.sweep")

RESTORE_TIMEOUT_S = 10.0
# NVML rounds a power limit to the board's step (often 1 W): a read-back within 1% or 1 W is the limit asked for.
LIMIT_TOLERANCE_MW = 1000



class GpuPowerError(PowerModeError):
    """NVML refused or failed a power-limit or clock change."""


class GpuPermissionError(GpuPowerError):
    """NVML answered NVML_ERROR_NO_PERMISSION: changing limits and clocks needs root."""


def write_gpu_hold(path: str | Path, job_id: str, original: GpuState) -> None:
    """Records ``original`` before the first change (atomically), where the Jetson's hold goes."""
    write_json_atomic(path, {"schema": GPU_HOLD_SCHEMA, "job": job_id, "since": time.time(), **original.to_dict()},
                      indent=1)


class NvmlPowerControl(Control):
    """Reads and changes one GPU's power limit and locked clocks through NVML.

    Args:
        pci_bus_id: The GPU's PCI bus id (the runner's ``pci_bus_id``); None: the CUDA runtime's device 0, else
            ``CUDA_VISIBLE_DEVICES`` (:func:`device.telemetry.nvml.cuda_device_handle`).
        uuid: The GPU's UUID (a hold's), used before the bus id.
    """

    def __init__(self, pci_bus_id: str | None = None, uuid: str | None = None):
        self.pci_bus_id, self.uuid = pci_bus_id, uuid
        self._nvml = None
        self._handle = None

    def open(self) -> None:
        """Initialises NVML and finds the GPU.

        Raises:
            MissingDependencyError: No nvidia-ml-py, no driver, or the GPU cannot be found.
        """
        from device.telemetry.nvml import cuda_device_handle, cuda_pci_bus_id

        nvml = require("pynvml", "nvidia-ml-py", "pip install nvidia-ml-py")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise MissingDependencyError(f"NVML is not usable here: {err}",
                                         fix="install the NVIDIA driver (nvidia-smi must work)") from None
        try:
            if self.uuid:
                handle = nvml.nvmlDeviceGetHandleByUUID(self.uuid)
            else:
                handle = cuda_device_handle(nvml, self.pci_bus_id or cuda_pci_bus_id())
        except (nvml.NVMLError, LookupError) as err:
            nvml.nvmlShutdown()
            raise MissingDependencyError(f"NVML cannot find the job's GPU: {err}",
                                         fix="run the agent with CUDA_VISIBLE_DEVICES set to the GPU's UUID") from None
        self._nvml, self._handle = nvml, handle
        self.uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        self.pci_bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # shutting down a driver that went away: nothing left to release
                pass
            self._nvml = self._handle = None

    def state(self) -> GpuState:
        return GpuState(self.pci_bus_id, self.uuid, int(self._call("nvmlDeviceGetPowerManagementLimit")))

    def limits_w(self) -> tuple[float, float]:
        """(min, max) power limit the GPU accepts, W."""
        low, high = self._call("nvmlDeviceGetPowerManagementLimitConstraints")
        return low / 1000, high / 1000

    def graphics_clocks_mhz(self) -> list[int]:
        """The graphics clocks the GPU supports at its highest memory clock, ascending."""
        memory = max(self._call("nvmlDeviceGetSupportedMemoryClocks"))
        return sorted(set(self._call("nvmlDeviceGetSupportedGraphicsClocks", memory)))

    def set_power_limit(self, watts: float) -> float:
        """Sets the limit and returns what NVML reads back, W.

        Raises:
            GpuPermissionError: Not root. GpuPowerError: NVML refused it, or reads back another limit.
        """
        want = int(round(watts * 1000))
        self._call("nvmlDeviceSetPowerManagementLimit", want)
        seen = int(self._call("nvmlDeviceGetPowerManagementLimit"))
        if abs(seen - want) > max(LIMIT_TOLERANCE_MW, 0.01 * want):
            raise GpuPowerError(f"NVML reads back a power limit of {seen / 1000:g} W after {watts:g} W was set",
                                fix="check the limit with nvidia-smi -q -d POWER (another tool may own it)")
        return seen / 1000

    def lock_clocks(self, mhz: int) -> None:
        """Locks the graphics clock at ``mhz`` (min = max).

        Raises:
            GpuPermissionError: Not root. GpuPowerError: NVML refused it.
        """
        self._call("nvmlDeviceSetGpuLockedClocks", mhz, mhz)

    def reset_clocks(self) -> None:
        self._call("nvmlDeviceResetGpuLockedClocks")

    def restore(self, original: GpuState) -> None:
        """Puts the original limit back and unlocks the clocks (every step tried, the first failure raised)."""
        failures = []
        for step in (lambda: self.set_power_limit(original.power_limit_mw / 1000), self.reset_clocks):
            try:
                step()
            except GpuPowerError as err:
                failures.append(err)
        if failures:
            raise failures[0]

    def _call(self, name: str, *args):
        nvml = self._nvml
        try:
            return getattr(nvml, name)(self._handle, *args)
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == nvml.NVML_ERROR_NO_PERMISSION:
                raise GpuPermissionError(f"NVML refused {name}: no permission (changing a GPU's power limit or "
                                         "clocks needs root)",
                                         fix="run the agent as root (its systemd unit does), or sweep nothing "
                                             "and measure the current setting") from None
            raise GpuPowerError(f"NVML {name} failed: {err}",
                                fix="check the GPU with nvidia-smi -q -d POWER,CLOCK") from None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def restore_gpu_hold(original: GpuState) -> None:
    """Restores a GPU hold's state (the agent's restore process; :func:`device.service.hold.restore_hold`)."""
    with NvmlPowerControl(pci_bus_id=original.pci_bus_id, uuid=original.uuid) as control:
        control.restore(original)


def _settings(sweep: SweepSpec, control: NvmlPowerControl) -> list[tuple[str, float | int]]:
    """The sweep's settings, each checked against what the GPU accepts before anything is changed.

    Raises:
        ConfigError: A limit outside the GPU's constraints, or a clock it does not support.
    """
    if sweep.power_limits_w is not None:
        low, high = control.limits_w()
        outside = [w for w in sweep.power_limits_w if not low <= w <= high]
        if outside:
            raise ConfigError(f"sweep.power_limits_w {outside} W is outside this GPU's limits [{low:g}, {high:g}] W "
                              "(nvmlDeviceGetPowerManagementLimitConstraints)",
                              fix=f"sweep limits between {low:g} and {high:g} W")
        return [("power_limit", w) for w in sweep.power_limits_w]
    clocks = control.graphics_clocks_mhz()
    unsupported = [mhz for mhz in sweep.gpu_clocks_mhz if not clocks or not clocks[0] <= mhz <= clocks[-1]]
    if unsupported:
        span = f"[{clocks[0]}, {clocks[-1]}] MHz" if clocks else "none"
        raise ConfigError(f"sweep.gpu_clocks_mhz {unsupported} is outside this GPU's graphics clocks {span} "
                          "(nvmlDeviceGetSupportedGraphicsClocks)", fix="sweep clocks nvidia-smi -q -d SUPPORTED_CLOCKS "
                                                                       "lists")
    return [("locked_clocks", mhz) for mhz in sweep.gpu_clocks_mhz]


def _restore(control, original, hold_path: Path, progress: Callable[[str], None]) -> tuple[bool, str | None]:
    """Puts back the limit and clocks found before the sweep; (whether they came back, what happened), never
    raising: the hold stays when they did not, and the agent retries and refuses other jobs until then."""
    if not hold_path.exists():  # nothing was changed
        return False, None
    try:
        progress("sweep: restoring the GPU's power limit and clocks")
        control.restore(original)
        hold_path.unlink(missing_ok=True)
        return True, f"restored {original.describe()}"
    except (GpuPowerError, OSError) as err:
        return False, f"{original.describe()} not restored by the job: {err}"


def run_gpu_sweep(sweep: SweepSpec, job_id: str, hold_path: Path, pci_bus_id: str | None,
                  measure_point: MeasurePoint, progress: Callable[[str], None],
                  budget: Any = None) -> tuple[list[Any], SweepResult]:
    """Visits every power limit or locked clock of ``sweep`` on the job's GPU and restores it.

    Args:
        sweep: The job's sweep (``power_limits_w`` or ``gpu_clocks_mhz``).
        job_id: Recorded in the hold.
        hold_path: The agent's hold file (shared with Jetson sweeps: one device, one hold).
        pci_bus_id: The PCI bus id of the GPU the runner uses.
        measure_point: Measures every batch size (and accelerator) under the current setting.
        progress: Reports where the sweep is.
        budget: A sustained job's time (:func:`device.jobs.sweep.run_sweep`'s): only ``late()`` is asked, the settings
            being known from the spec.

    Returns:
        (every window measured, the sweep's record).

    Raises:
        DeviceHeldError: Another sweep's hold is still in place.
        ConfigError: A setting the GPU does not accept (before anything is changed).
    """
    try:
        control = NvmlPowerControl(pci_bus_id=pci_bus_id)
        control.open()
    except MissingDependencyError as err:
        progress("sweep: no NVML control, measuring the current setting")
        return measure_point(None, "current setting"), SweepResult(
            controlled=False, note=f"no NVML power control ({err.message}): measured the current setting only")
    with control:
        refuse_if_held(hold_path, fix="restart the agent: it restores the original state first")
        settings = _settings(sweep, control)
        original = control.state()
        write_gpu_hold(hold_path, job_id, original)  # before the first change: a kill -9 leaves what to restore
        runs: list[Any] = []
        not_measured: list[NotMeasured] = []
        where = "before the first setting"
        try:
            for index, (kind, value) in enumerate(settings, start=1):
                label = f"{value:g} W limit" if kind == "power_limit" else f"{value} MHz locked"
                where = f"setting {index}/{len(settings)} ({label})"
                if budget is not None and (reason := budget.late()):  # a sustained job's time is up: left unset
                    not_measured.append(NotMeasured(nvpmodel_id=None, nvpmodel_name=label, jetson_clocks=None,
                                                    kind="skipped", reason=reason))
                    continue
                progress(f"sweep {where}: setting")
                started = time.monotonic()
                try:
                    if kind == "power_limit":
                        setting = PowerSetting(power_limit_w=control.set_power_limit(value), settle_s=0.0)
                    else:
                        control.lock_clocks(value)
                        setting = PowerSetting(gpu_locked_mhz=value, settle_s=0.0)
                except GpuPermissionError as err:
                    if runs:  # permission does not come and go: say so on the setting
                        not_measured.append(NotMeasured(nvpmodel_id=None, nvpmodel_name=label, jetson_clocks=None,
                                                        kind="refused", reason=err.message))
                        continue
                    hold_path.unlink(missing_ok=True)  # nothing was changed
                    progress("sweep: no permission to change the GPU, measuring the current setting")
                    return measure_point(None, "current setting"), SweepResult(
                        controlled=False, note=f"{err.message}: measured the current setting only")
                except GpuPowerError as err:
                    not_measured.append(NotMeasured(nvpmodel_id=None, nvpmodel_name=label, jetson_clocks=None,
                                                    kind="refused", reason=err.message))
                    continue
                setting.settle_s = time.monotonic() - started
                runs += measure_point(setting, f"sweep {where}")
        except Exception as err:
            log.exception("sweep stopped at %s", where)
            restored, restore_note = _restore(control, original, hold_path, progress)
            raise SweepStoppedError.after(err, where, restore_note) from err
        restored, restore_note = _restore(control, original, hold_path, progress)
    return controlled_result(runs, original, restored, restore_note, not_measured,
                             fix="check the GPU's limits and clocks with nvidia-smi -q -d POWER,CLOCK")

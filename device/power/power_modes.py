"""Power modes on a Jetson: set through the jtop service, checked against the board's nvpmodel configuration,
and the device left as it was found.

A mode is set the way jtop's own clients set it (``jetson.nvpmodel = id``, ``jetson.jetson_clocks = bool``
over the service's socket, root:jtop 0660), never by running ``nvpmodel`` here. A mode has *taken effect*
when jtop reports it and the online cores and the CPU and GPU maximum clocks that jtop reads from sysfs
match the mode's lines in the nvpmodel configuration (``/etc/nvpmodel.conf``); current clocks are not
compared: they move with DVFS unless ``jetson_clocks`` pins them. Modes that need a reboot (another
TPC or core mask) are those jtop's ``nvpmodel.status`` marks False: they are never set, and never forced
(forcing one reboots the board).

Before the first change a *hold* is written atomically in the agent's data dir: the mode and
``jetson_clocks`` state found. Whoever ends a sweep (the job process, the agent after a cancel or
timeout, the agent at start-up after a crash or ``kill -9``) restores from it and removes it only once
jtop shows the original mode back; while it remains, the agent refuses other jobs. ``python -m
device.service.hold restore`` (:mod:`device.service.hold`) is that restore, in a process of its own: importing jtop changes the
multiprocessing start method of its whole process, so the agent daemon never imports it.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device.power import jtop_client
from device.power.gpu_state import GPU_HOLD_SCHEMA, gpu_hold_state
from device.errors import DeviceError, MissingDependencyError
from device.files import write_json_atomic
from device.telemetry.jtop import gpu_khz, gpu_units_differ, jetson_clocks_on

DEFAULT_CONF = "/etc/nvpmodel.conf"
HOLD_FILE = "power_mode_hold.json"
HOLD_SCHEMA = "edgefold.power-hold/1"
# nvpmodel writes a cap and the kernel rounds it to the clock's nearest operating setting, so a cap
# read back may differ a little from the configured value; 2% is far below the gap between any two
# modes' caps (Orin Nano: 625 vs 1020 MHz GPU, 1.51 vs 1.73 GHz CPU).
CAP_TOLERANCE = 0.02
# nvpmodel.conf writes "no cap" as -1, 0 or INT_MAX.
_NO_CAP = (-1, 0, 2147483647)
REASK_S = 1.0
_HEADER = re.compile(r"^<\s*(?P<kind>PARAM|POWER_MODEL|PM_CONFIG)\s+(?P<attrs>[^>]*)>\s*$")
_CPU_IN_PATH = re.compile(r"/cpu(?P<cpu>\d+)/")


class PowerModeError(DeviceError):
    """A power mode could not be set, checked or restored."""


class ModeUnavailableError(PowerModeError):
    """A setting that is never set: its mode needs a reboot, or it asks for jetson_clocks the board lacks."""


class ModeNotSettledError(PowerModeError):
    """A mode was set but the device did not show it (cores, caps, jetson_clocks) within the time limit."""


class ServiceLostError(PowerModeError):
    """The jtop service stopped answering (or its connection was lost) while a mode was set, read or restored."""


LOST_FIX = "sudo systemctl restart jtop.service, then restart the agent (it restores the original mode)"


class DeviceHeldError(PowerModeError):
    """The device is still in a sweep's mode: its original mode could not be restored yet."""


@dataclass
class ModeCaps:
    """What one nvpmodel mode sets, from the configuration file.

    Attributes:
        id: The mode's id (``nvpmodel -m ID``).
        name: Its name (``15W``, ``MAXN_SUPER``).
        online: Core index → whether the mode keeps it online (cores the file does not name are left out).
        cpu_max_khz: Core index → the cpufreq ``scaling_max_freq`` cap (the core named in the cluster's path).
        gpu_max_hz: The GPU devfreq ``max_freq`` cap; None when the mode does not cap it.
    """

    id: int
    name: str
    online: dict[int, bool] = field(default_factory=dict)
    cpu_max_khz: dict[int, int] = field(default_factory=dict)
    gpu_max_hz: int | None = None


def parse_nvpmodel_conf(text: str) -> dict[int, ModeCaps]:
    """The modes of an nvpmodel configuration (NVIDIA's ``/etc/nvpmodel.conf`` format).

    ``< PARAM TYPE=CLOCK NAME=X >`` sections say which sysfs file each clock name writes (a CPU
    cluster's ``cpuN/cpufreq/scaling_max_freq``, the GPU's devfreq ``max_freq``); ``< POWER_MODEL
    ID=… NAME=… >`` sections give each mode's values (``CPU_ONLINE CORE_n 0|1``, ``X MAX_FREQ v``).

    Raises:
        PowerModeError: No mode in the text.
    """
    clock_cores: dict[str, int] = {}  # clock name → the core whose scaling_max_freq it writes
    gpu_clocks: set[str] = set()
    online_cores: dict[str, int] = {}  # CORE_n → its cpu index, from the CPU_ONLINE section's paths
    modes: dict[int, ModeCaps] = {}
    section: tuple[str, dict[str, str]] | None = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        header = _HEADER.match(line)
        if header:
            attrs = dict(part.split("=", 1) for part in header["attrs"].split() if "=" in part)
            section = (header["kind"], attrs)
            if header["kind"] == "POWER_MODEL" and attrs.get("ID", "").isdigit():
                mode_id = int(attrs["ID"])
                modes[mode_id] = ModeCaps(mode_id, attrs.get("NAME", str(mode_id)))
            continue
        if section is None:
            continue
        kind, attrs = section
        words = line.split()
        if kind == "PARAM" and len(words) == 2:
            name, path = attrs.get("NAME", ""), words[1]
            cpu = _CPU_IN_PATH.search(path)
            if name == "CPU_ONLINE" and cpu:
                online_cores[words[0]] = int(cpu["cpu"])
            elif words[0] == "MAX_FREQ" and path.endswith("scaling_max_freq") and cpu:
                clock_cores[name] = int(cpu["cpu"])
            elif words[0] == "MAX_FREQ" and "devfreq" in path and name.startswith("GPU"):
                gpu_clocks.add(name)
        elif kind == "POWER_MODEL" and len(words) == 3 and attrs.get("ID", "").isdigit():
            mode = modes[int(attrs["ID"])]
            try:
                value = int(words[2])
            except ValueError:
                continue
            if words[0] == "CPU_ONLINE" and words[1] in online_cores:
                mode.online[online_cores[words[1]]] = value == 1
            elif words[1] == "MAX_FREQ" and value not in _NO_CAP:
                if words[0] in clock_cores:
                    mode.cpu_max_khz[clock_cores[words[0]]] = value
                elif words[0] in gpu_clocks:
                    mode.gpu_max_hz = value
    if not modes:
        raise PowerModeError("the nvpmodel configuration defines no POWER_MODEL",
                             fix="setting the agent's nvpmodel_conf at the board's file (/etc/nvpmodel.conf)")
    return modes


def read_nvpmodel_conf(path: str | Path) -> dict[int, ModeCaps]:
    """The modes of the configuration file at ``path``.

    Raises:
        PowerModeError: The file cannot be read or defines no mode.
    """
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as err:
        raise PowerModeError(f"cannot read the nvpmodel configuration {path}: {err.strerror}: without it the agent "
                             "cannot check that a mode took effect",
                             fix="set nvpmodel_conf in the agent's config to the board's file "
                                 "(ls -l /etc/nvpmodel.conf shows which one it links to)") from None
    return parse_nvpmodel_conf(text)


@dataclass(frozen=True)
class DeviceState:
    """The power mode and jetson_clocks state jtop reports (``jetson_clocks`` None: the board has none)."""

    nvpmodel_id: int
    nvpmodel_name: str
    jetson_clocks: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {"nvpmodel_id": self.nvpmodel_id, "nvpmodel_name": self.nvpmodel_name,
                "jetson_clocks": self.jetson_clocks}

    def describe(self) -> str:
        clocks = "" if self.jetson_clocks is None else f", jetson_clocks {'on' if self.jetson_clocks else 'off'}"
        return f"{self.nvpmodel_name} (id {self.nvpmodel_id}){clocks}"

    def by_hand(self) -> str:
        """The command that restores it without EdgeFold."""
        return f"sudo nvpmodel -m {self.nvpmodel_id}"


@dataclass(frozen=True)
class PowerMode:
    """One mode jtop lists: ``available`` False when jtop says it needs a reboot (another TPC/core mask)."""

    id: int
    name: str
    available: bool


@dataclass(frozen=True)
class Observed:
    """The caps and online cores jtop read from sysfs in one measurement."""

    online: dict[int, bool]
    cpu_max_khz: dict[int, int]
    gpu_max_khz: int | None
    jetson_clocks: bool | None
    nvpmodel_id: int

    def mismatches(self, caps: ModeCaps, jetson_clocks: bool | None) -> list[str]:
        """How this differs from ``caps`` (and the wanted jetson_clocks state); empty when it matches."""
        problems = []
        for core, online in sorted(caps.online.items()):
            if self.online.get(core) is not None and self.online[core] != online:
                problems.append(f"cpu{core} {'offline' if online else 'online'} (the mode has it "
                                f"{'online' if online else 'offline'})")
        for core, khz in sorted(caps.cpu_max_khz.items()):
            seen = self.cpu_max_khz.get(core)
            if caps.online.get(core, True) and seen is not None and abs(seen - khz) > CAP_TOLERANCE * khz:
                problems.append(f"cpu{core} max {seen / 1000:g} MHz (the mode caps it at {khz / 1000:g} MHz)")
        if caps.gpu_max_hz is not None and self.gpu_max_khz is not None:
            want_khz = caps.gpu_max_hz / 1000
            if abs(self.gpu_max_khz - want_khz) > CAP_TOLERANCE * want_khz:
                problems.append(f"GPU max {self.gpu_max_khz / 1000:g} MHz "
                                f"(the mode caps it at {want_khz / 1000:g} MHz)")
        if jetson_clocks is not None and self.jetson_clocks is not None and self.jetson_clocks != jetson_clocks:
            problems.append(f"jetson_clocks {'on' if self.jetson_clocks else 'off'} (wanted "
                            f"{'on' if jetson_clocks else 'off'})")
        return problems

    def to_point(self) -> dict[str, Any]:
        """The fields of :class:`device.schema.PowerSetting` this measurement fills."""
        return {"online_cores": sorted(core for core, online in self.online.items() if online),
                "cpu_max_khz": {core: khz for core, khz in sorted(self.cpu_max_khz.items()) if self.online.get(core)},
                "gpu_max_khz": self.gpu_max_khz}


class Control:
    """Something a sweep opens, changes and closes (the jtop service, NVML): a context manager over open/close."""

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ModeController(Control):
    """Sets and reads power modes through a jtop client of its own.

    Open it at the rate the job's jtop sampler asks for: the service's interval belongs to its first client.

    Args:
        interval_s: The jtop client's interval.
        poll_s: How often a wait looks again.
        jetson: An open jtop client to use instead of one of its own (the job's sampler's: every client unpickles
            the service's whole stats each tick), left open at :meth:`close`.
    """

    def __init__(self, interval_s: float = 0.5, poll_s: float = 0.1, jetson=None):
        self.interval_s, self.poll_s = interval_s, poll_s
        self._borrowed = jetson
        self._jetson = None
        self._lost: tuple[type[BaseException], ...] = (EOFError, OSError)

    def open(self) -> None:
        """Connects to the jtop service.

        Raises:
            MissingDependencyError: jetson-stats is not installed, the service does not answer, or the
                board has no nvpmodel.
        """
        jetson = self._borrowed if self._borrowed is not None else jtop_client.start(self.interval_s)
        self._lost = jtop_client.lost_errors()
        if jetson.nvpmodel is None:
            if self._borrowed is None:
                jetson.close()
            raise MissingDependencyError("jtop reports no nvpmodel on this board: power modes cannot be set",
                                         fix="install the board's nvpmodel (JetPack's nvidia-l4t-nvpmodel) and "
                                             "restart jtop.service")
        self._jetson = jetson

    def close(self) -> None:
        if self._jetson is not None and self._borrowed is None:
            try:
                self._jetson.close()
            except Exception:  # a service that died makes close raise its raw errors: nothing is left to close
                pass
        self._jetson = None

    @property
    def jetson(self):
        if self._jetson is None:
            raise RuntimeError("ModeController is not open")
        return self._jetson

    def state(self) -> DeviceState:
        """The mode and jetson_clocks state jtop reports now."""
        return self._guarded("reading the power mode", self._state)

    def _state(self) -> DeviceState:
        return DeviceState(int(self.jetson.nvpmodel.id), str(self.jetson.nvpmodel.name), jetson_clocks_on(self.jetson))

    @property
    def has_jetson_clocks(self) -> bool:
        return self.jetson.jetson_clocks is not None

    def modes(self) -> list[PowerMode]:
        """Every mode jtop lists, in id order, with whether it can be set without a reboot."""
        return self._guarded("listing the power modes", self._modes)

    def _modes(self) -> list[PowerMode]:
        status = list(self.jetson.nvpmodel.status)
        return [PowerMode(index, name, bool(status[index]) if index < len(status) else False)
                for index, name in enumerate(self.jetson.nvpmodel.models)]

    def observe(self) -> Observed:
        """The caps, online cores and states of the newest measurement jtop delivered."""
        jetson = self.jetson
        online, cpu_max = {}, {}
        for index, cpu in enumerate(jetson.cpu.get("cpu", [])):
            online[index] = bool(cpu.get("online", True))
            if online[index] and isinstance(cpu.get("freq"), dict) and "max" in cpu["freq"]:
                cpu_max[index] = int(cpu["freq"]["max"])
        gpu_max = None
        for entry in jetson.gpu.values():
            if isinstance(entry, dict) and isinstance(entry.get("freq"), dict) and "max" in entry["freq"]:
                gpu_max = gpu_khz(entry["freq"]["max"])
                break
        state = self.state()
        return Observed(online, cpu_max, gpu_max, state.jetson_clocks, state.nvpmodel_id)

    def _wait(self, deadline: float) -> None:
        # ok() without blocking: its blocking form stops the client's reader for good after one stall.
        time.sleep(self.poll_s)
        if not self.jetson.ok(spin=True):
            raise ServiceLostError("the jtop service stopped answering while a power mode was being set "
                                   "(its client missed three intervals)", fix=LOST_FIX)
        if time.monotonic() > deadline:
            raise TimeoutError

    def _guarded(self, what: str, call, *args):
        """Runs ``call`` with a lost service's errors, whichever jtop raises, as :class:`ServiceLostError`."""
        try:
            return call(*args)
        except self._lost as err:
            raise ServiceLostError(f"the jtop service was lost while {what}: {type(err).__name__}: {err}",
                                   fix=LOST_FIX) from err

    def set(self, mode: PowerMode, jetson_clocks: bool | None, caps: ModeCaps | None,
            timeout_s: float) -> tuple[Observed, float]:
        """Sets ``mode``: see :meth:`_set`; a lost service raises :class:`ServiceLostError` with jtop's own error."""
        return self._guarded(f"setting power mode {mode.name}", self._set, mode, jetson_clocks, caps, timeout_s)

    def _set(self, mode: PowerMode, jetson_clocks: bool | None, caps: ModeCaps | None,
             timeout_s: float) -> tuple[Observed, float]:
        """Sets ``mode`` (and jetson_clocks unless None) and waits until the device shows it.

        jetson_clocks is switched off before a mode change and on after it, as jtop's own nvpmodel
        thread does: pinned clocks would otherwise be pinned at the old mode's caps.

        Returns:
            (what jtop read once the mode had taken effect, seconds it took).

        Raises:
            ModeUnavailableError: The mode needs a reboot, or jetson_clocks was asked for on a board without it
                (nothing was changed).
            ModeNotSettledError: The device did not show the mode within ``timeout_s`` (with what differed).
            PowerModeError: The jtop service stopped answering, or refused the request.
        """
        if not mode.available:
            raise ModeUnavailableError(
                f"power mode {mode.name} (id {mode.id}) needs a reboot: jtop marks it unavailable (its TPC/core mask "
                "differs from the current mode's) and forcing it reboots the board",
                fix="set it by hand (sudo nvpmodel -m ID, then reboot) and sweep the modes that share its mask")
        if jetson_clocks is not None and not self.has_jetson_clocks:
            raise ModeUnavailableError("jetson_clocks is not available through jtop on this board",
                                       fix="leave jetson_clocks out of the sweep, or install jetson_clocks (JetPack)")
        started = time.monotonic()
        deadline = started + timeout_s
        last: Observed | None = None
        try:
            clocks_restored = False
            if self.state().jetson_clocks and jetson_clocks is False:
                self._until(lambda: self.state().jetson_clocks is False, lambda: self._clocks(False), deadline)
                # Off shows as soon as one core's minimum moves, while --restore still writes: wait until it ends.
                self._until(lambda: self.jetson.jetson_clocks.status == "inactive", lambda: None, deadline)
                clocks_restored = True
            if clocks_restored and self.state().nvpmodel_id == mode.id:
                self._reapply(mode, caps, deadline)
            self._until(lambda: self.state().nvpmodel_id == mode.id and not self.jetson.nvpmodel.is_running(),
                        lambda: self._mode(mode.id), deadline)
            if jetson_clocks:
                self._until(lambda: self.state().jetson_clocks is True, lambda: self._clocks(True), deadline)
            while True:
                last = self.observe()
                if last.nvpmodel_id == mode.id and not (caps and last.mismatches(caps, jetson_clocks)):
                    return last, time.monotonic() - started
                self._wait(deadline)
        except TimeoutError:
            last = last or self.observe()
            differs = (last.mismatches(caps, jetson_clocks) if caps else []) or \
                [f"jtop reports mode {self.state().describe()}"]
            raise ModeNotSettledError(
                f"power mode {mode.name} (id {mode.id}) did not take effect within {timeout_s:g} s: "
                + "; ".join(differs),
                fix="check nvpmodel by hand (sudo nvpmodel -q --verbose shows each setting's real and configured "
                    "value) and jtop's log (journalctl -u jtop); raise sweep.settle_timeout_s if it is only slow") \
                from None

    def _until(self, done, act, deadline: float) -> None:
        # jtop drops a request while its service is busy with the previous one: ask again until it shows, but
        # not faster than REASK_S (a request takes the service a tick or two to start on).
        asked = -math.inf
        while not done():
            status = self.jetson.jetson_clocks.status if self.has_jetson_clocks else "inactive"
            idle = not self.jetson.nvpmodel.is_running() and status in ("inactive", "running")
            if idle and time.monotonic() - asked > REASK_S:
                act()
                asked = time.monotonic()
            self._wait(deadline)

    def _reapply(self, mode: PowerMode, caps: ModeCaps | None, deadline: float) -> None:
        """Sets the current mode again after jetson_clocks was switched off.

        jtop switches it off with ``jetson_clocks --restore`` from a file it stored once, when none existed, and
        keeps across restarts (jtop/core/jetson_clocks.py at 7.2.2: ``initialization``, ``_th_stop``): the cores
        and caps of whatever mode ran then come back. A new mode's ``nvpmodel -m`` rewrites them; the same mode
        needs asking again, and jtop's client drops a request for the id it already reports
        (jtop/core/nvpmodel.py, ``set_nvpmodel_id``) while its service takes it (the same id has the same mask).
        The request goes to the service as the client would send it, without ``force``, which would answer a
        reboot prompt with YES.
        """
        # Asked once whatever jtop shows: its last reading may predate the restore (a loaded host, a slow tick), and a
        # check of it would skip the request the restored cores and caps need. Then nvpmodel is seen to start (or
        # to finish between two ticks) and to end; with caps, asked again until they show.
        self._mode(mode.id, same=True)
        started = time.monotonic()
        while not self.jetson.nvpmodel.is_running() and time.monotonic() - started < REASK_S:
            self._wait(deadline)
        self._until(lambda: not self.jetson.nvpmodel.is_running(), lambda: None, deadline)
        if caps is not None:
            self._until(lambda: not self.observe().mismatches(caps, None), lambda: self._mode(mode.id, same=True),
                        deadline)

    def _mode(self, mode_id: int, same: bool = False) -> None:
        try:  # by id: the id is what nvpmodel -m takes
            nvpmodel = self.jetson.nvpmodel
            if same and hasattr(nvpmodel, "_controller"):
                # The client's setter returns without sending when the id is the one it reports: send what it sends
                # (jetson-stats 7.2.2, jtop/core/nvpmodel.py set_nvpmodel_id), force off.
                nvpmodel._controller.put({"nvp": {"id": mode_id, "force": False}})
            else:
                self.jetson.nvpmodel = mode_id
        except (EOFError, OSError):  # the request's socket is closed: a lost service, not a refusal
            raise
        except Exception as err:  # jtop's JtopException/ValueError: a mode it does not list
            raise PowerModeError(f"jtop refused power mode {mode_id}: {err}",
                                 fix="list the board's modes: nvpmodel -p --verbose") from None

    def _clocks(self, on: bool) -> None:
        try:
            clocks = self.jetson.jetson_clocks
            if bool(clocks) is on and gpu_units_differ(self.jetson) and hasattr(clocks, "_controller"):
                if not on and not clocks.is_config():  # the client's own guard, which its setter would apply
                    raise PowerModeError("jtop cannot switch jetson_clocks off: it stored no configuration to "
                                         "restore (jetson_clocks was on when its service started)",
                                         fix="switch it by hand (sudo jetson_clocks --restore), then restart "
                                             "jtop.service")
                # jtop's client drops a request for the state it reports, and on Thor it reports off while the
                # clocks are pinned (_gpu_units_differ): send the request its setter would (jetson-stats 7.2.2,
                # jtop/core/jetson_clocks.py set_enable); the service acts on it whatever it reports.
                clocks._controller.put({"jc": {"enable": on}})
            else:
                self.jetson.jetson_clocks = on
        except (EOFError, OSError):
            raise
        except Exception as err:  # jtop refuses to switch off a jetson_clocks it did not start ("uncontrolled")
            raise PowerModeError(f"jtop cannot switch jetson_clocks {'on' if on else 'off'}: {err}",
                                 fix="switch it by hand (sudo jetson_clocks --restore), then restart jtop.service") \
                from None

    def restore(self, original: DeviceState, caps: ModeCaps | None, timeout_s: float) -> Observed:
        """Puts the device back in ``original`` and waits until it shows.

        Raises:
            ModeNotSettledError: It did not come back within ``timeout_s``.
            ServiceLostError: The jtop service is gone (jtop's own error in the message).
            PowerModeError: jtop no longer lists the original mode.
        """
        return self._guarded(f"restoring {original.describe()}", self._restore, original, caps, timeout_s)

    def _restore(self, original: DeviceState, caps: ModeCaps | None, timeout_s: float) -> Observed:
        modes = {mode.id: mode for mode in self.modes()}
        if original.nvpmodel_id not in modes:
            raise PowerModeError(f"jtop no longer lists the original power mode {original.describe()}",
                                 fix=f"set it by hand: sudo nvpmodel -m {original.nvpmodel_id}")
        # The original mode shares the mask the sweep ran under, so it needs no reboot; jtop's status is
        # relative to the mode it started in, which is not the setting here.
        mode = PowerMode(original.nvpmodel_id, original.nvpmodel_name, True)
        observed, _ = self._set(mode, original.jetson_clocks if self.has_jetson_clocks else None, caps, timeout_s)
        return observed


# ------------------------------------------------------------------ the hold: what to restore
def write_hold(path: str | Path, job_id: str, original: DeviceState) -> None:
    """Records ``original`` before the first change (atomically: a kill leaves the old file or the new one)."""
    write_json_atomic(path, {"schema": HOLD_SCHEMA, "job": job_id, "since": time.time(), **original.to_dict()},
                      indent=1)


def read_hold(path: str | Path) -> tuple[str, Any] | None:
    """(job id, original state) of the hold at ``path``; None when there is none. The state is a
    :class:`DeviceState` (a Jetson's mode) or a :class:`device.power.gpu_power.GpuState` (a GPU's NVML power limit).

    Raises:
        PowerModeError: A file that is not a hold (it is kept: it may be the only record of the original mode).
    """
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise PowerModeError(f"the power-mode hold {path} is unreadable ({err}); the original mode is unknown",
                             fix="set the board's mode by hand (sudo nvpmodel -m ID; jetson_clocks --restore), "
                                 f"then delete {path}") from None
    try:
        if data.get("schema") == GPU_HOLD_SCHEMA:
            return str(data["job"]), gpu_hold_state(data)
        if data.get("schema") != HOLD_SCHEMA:
            raise KeyError("schema")
        state = DeviceState(int(data["nvpmodel_id"]), str(data["nvpmodel_name"]),
                            None if data["jetson_clocks"] is None else bool(data["jetson_clocks"]))
        return str(data["job"]), state
    except (KeyError, TypeError, ValueError, AttributeError):
        raise PowerModeError(f"{path} is not an EdgeFold power-mode hold ({HOLD_SCHEMA})",
                             fix=f"set the board's mode by hand (sudo nvpmodel -m ID), then delete {path}") from None

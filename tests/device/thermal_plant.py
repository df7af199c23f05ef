"""A PLANTED thermal model for the simulated Jetson (tests only): a first-order heat curve driven by the board's
planted power, the trip points the kernel lists, and the GPU clock stepped down at the passive trip point.

On this host nothing heats: a sustained job's throttle moment and settled latency could not be checked against
anything. Here a thread writes the simulated board's ``gpu-thermal`` zone every tick. Its steady state is the
ambient plus a thermal resistance times the board's input power as the simulation plants it now (the INA3221's
VDD_IN, which the simulated ``nvpmodel`` sets per mode: 6.1 W at 15W, 12.2 W at MAXN_SUPER on the Orin Nano;
SYNTHETIC), so a mode with more watts settles hotter; the temperature moves toward it with time constant
``tau_s`` (``T ← Tss + (T − Tss)·e^(−dt/τ)``, exact while the power holds). The zone lists a passive trip point at
``trip_c`` and a critical one at ``critical_c`` (``trip_point_N_type/temp``, synthetic values). The GPU's devfreq
``cur_freq`` is ``initial_hz`` from the plant's making; at the passive trip point it is held at ``throttled_hz``
(against a mode change that rewrites it), and given back ``hysteresis_c`` below it. The clocked TensorRT stand-in
(:mod:`tests.device.clocked_runtime`) times each call from that clock, so the latency doubles when the clock halves:
the planted moments (:attr:`ThermalPlant.events`, :meth:`ThermalPlant.throttle_at_s`) and ratio are known.

``dip_hz``, ``dip_every_s`` and ``dip_s`` plant a DVFS governor (jetson_clocks off): every ``dip_every_s`` the GPU's
``cur_freq`` drops to ``dip_hz`` for ``dip_s`` and comes back, the instantaneous clock jtop reads
(jtop/core/gpu.py at 7.2.2), which is no throttle.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from pathlib import Path

from tests.device.jetson_sim import HWMON, _read_int, _replace, gpu_devfreq
from tests.device.time_scale import TimeScale

ZONES = "sys/devices/virtual/thermal"


def zone_folder(root: str | Path, zone: str) -> Path:
    """The planted folder of the zone of type ``zone``."""
    for folder in sorted((Path(root) / ZONES).glob("thermal_zone*")):
        if (folder / "type").read_text().strip() == zone:
            return folder
    raise LookupError(f"no thermal zone {zone!r} under {root}")


class ThermalPlant:
    """The heat curve, trip points and clock step of one zone, written by a thread while it runs."""

    def __init__(self, root: str | Path, start_c: float, tau_s: float, ambient_c: float = 30.0,
                 c_per_w: float = 8.0, trip_c: float = 95.0, critical_c: float = 105.0,
                 throttled_hz: int | None = None, initial_hz: int | None = None, hysteresis_c: float = 3.0,
                 zone: str = "gpu-thermal", tick_s: float = 0.05, dip_hz: int | None = None,
                 dip_every_s: float = 1.0, dip_s: float = 0.15, clock: TimeScale | None = None):
        self.root, self.start_c, self.tau_s, self.ambient_c, self.c_per_w = Path(root), start_c, tau_s, ambient_c, \
            c_per_w
        self.trip_c, self.critical_c, self.throttled_hz, self.tick_s = trip_c, critical_c, throttled_hz, tick_s
        self.initial_hz, self.hysteresis_c = initial_hz, hysteresis_c
        self.dip_hz, self.dip_every_s, self.dip_s = dip_hz, dip_every_s, dip_s
        # Simulated time shared with the job (tests.device.time_scale), or the host's.
        self._monotonic, self._wall = (clock.monotonic, clock.wall) if clock else (time.monotonic, time.time)
        self._elapsed_s = 0.0
        self._dipped_from: int | None = None  # the clock a governor dip took over (given back after it)
        self.dips = 0
        self.folder = zone_folder(root, zone)
        self.clock = gpu_devfreq(root) / "cur_freq"
        self.started_at: float | None = None  # the wall clock's (simulated or the host's) time of t = 0
        self.events: list[tuple[float, str]] = []  # (wall time, "throttled" or "recovered")
        self.temp_c = start_c
        self._held_hz: int | None = None  # the clock the throttle took over (given back on recovery)
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thermal-plant", daemon=True)
        for index, (kind, temp_c) in enumerate((("passive", trip_c), ("critical", critical_c))):
            _replace(self.folder / f"trip_point_{index}_type", kind)
            _replace(self.folder / f"trip_point_{index}_temp", int(temp_c * 1000))
        _replace(self.folder / "temp", int(start_c * 1000))
        if initial_hz:  # from the first call on (the plant is made before the job runs, heats once entered)
            _replace(self.clock, initial_hz)

    def power_w(self) -> float:
        """The board's input power the simulation plants now (VDD_IN: mV × mA on the first INA3221's channel 1)."""
        hwmon = self.root / HWMON
        return _read_int(hwmon / "in1_input") * _read_int(hwmon / "curr1_input") / 1e6

    def steady_c(self, power_w: float | None = None) -> float:
        """Where the zone settles at ``power_w`` (default: the power planted now)."""
        return self.ambient_c + self.c_per_w * (self.power_w() if power_w is None else power_w)

    def throttle_at_s(self) -> float | None:
        """The planted moment, from the start, the zone reaches its passive trip point while the power planted now
        holds (None: it settles below it)."""
        steady = self.steady_c()
        if steady <= self.trip_c:
            return None
        return -self.tau_s * math.log((steady - self.trip_c) / (steady - self.start_c))

    def first(self, event: str, after: float = 0.0) -> float | None:
        """The wall time (the plant's clock) of the first ``event`` at or after ``after`` (None: none)."""
        return next((at for at, name in self.events if name == event and at >= after), None)

    def _tick(self, dt: float) -> None:
        steady = self.steady_c()
        self.temp_c = steady + (self.temp_c - steady) * math.exp(-dt / self.tau_s)
        _replace(self.folder / "temp", int(self.temp_c * 1000))
        self._elapsed_s += dt
        if self.dip_hz:
            dipping = self._elapsed_s % self.dip_every_s >= self.dip_every_s - self.dip_s
            if dipping and self._dipped_from is None:
                self._dipped_from = _read_int(self.clock)
                _replace(self.clock, self.dip_hz)
                self.dips += 1
            elif not dipping and self._dipped_from is not None:
                _replace(self.clock, self._dipped_from)
                self._dipped_from = None
        if not self.throttled_hz:
            return
        now_hz = _read_int(self.clock)
        if self._held_hz is None and self.temp_c >= self.trip_c:
            self._held_hz = now_hz
            _replace(self.clock, self.throttled_hz)
            self.events.append((self._wall(), "throttled"))
        elif self._held_hz is not None and self.temp_c < self.trip_c - self.hysteresis_c:
            _replace(self.clock, min(self._held_hz, _read_int(self.clock.parent / "max_freq")))
            self._held_hz = None
            self.events.append((self._wall(), "recovered"))
        elif self._held_hz is not None and now_hz != self.throttled_hz:
            self._held_hz = now_hz  # jetson_clocks or a mode rewrote the clock: what it set comes back on recovery
            _replace(self.clock, self.throttled_hz)

    def _run(self) -> None:
        last = self._monotonic()
        while not self._stop.wait(self.tick_s):
            now = self._monotonic()
            try:
                self._tick(now - last)
            except Exception as err:  # noqa: BLE001 (kept for __exit__: a frozen curve must fail the test)
                self.error = err
                return
            last = now

    def __enter__(self) -> "ThermalPlant":
        self.started_at = self._wall()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None and exc[0] is None:  # not over a failure inside the block
            raise AssertionError(f"the thermal plant stopped heating: {self.error!r}") from self.error


@contextlib.contextmanager
def heating_with_the_run(agent, plant: ThermalPlant):
    """Starts ``plant`` when a job running on ``agent`` (a :class:`tests.device.agent_process.AgentProcess`) first
    reports "sustained: started" (the heat comes with the run, not with the ladder's windows before it), and stops
    it when the block ends."""
    from device.client import AgentClient

    done = threading.Event()

    def heat() -> None:
        with AgentClient(agent.url, agent.token_file.read_text().strip(), timeout_s=10) as client:
            while not done.is_set():
                if any("sustained: started" in (job.get("progress") or "") for job in client.jobs("running")):
                    with plant:
                        done.wait()
                    return
                time.sleep(0.02)

    watcher = threading.Thread(target=heat, name="heat-with-the-run", daemon=True)
    watcher.start()
    try:
        yield plant
    finally:
        done.set()
        watcher.join()

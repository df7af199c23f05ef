"""A PLANTED thermal model for the simulated Jetson (tests only): a first-order heat curve, the trip points the kernel
lists, and the GPU clock stepped down at the passive trip point.

On this host nothing heats: a sustained job's throttle moment and settled latency could not be checked against
anything. Here a thread writes the simulated board's ``gpu-thermal`` zone every tick, rising from ``start_c``
toward ``steady_c`` with time constant ``tau_s`` (``T(t) = steady − (steady − start)·e^(−t/τ)``, synthetic); the
zone lists a passive trip point at ``trip_c`` and a critical one at ``critical_c`` (``trip_point_N_type/temp``,
synthetic values); the GPU's devfreq ``cur_freq`` is ``initial_hz`` from the plant's making and, when the temperature reaches the
passive trip point, is stepped down to ``throttled_hz`` and stays there. The clocked TensorRT stand-in (:mod:`tests.device.clocked_runtime`)
times each call from that clock, so the latency doubles when the clock halves: the planted moment
(:meth:`ThermalPlant.throttle_at_s`) and ratio are known in advance.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

from tests.device.jetson_sim import _replace, gpu_devfreq

ZONES = "sys/devices/virtual/thermal"


def zone_folder(root: str | Path, zone: str) -> Path:
    """The planted folder of the zone of type ``zone``."""
    for folder in sorted((Path(root) / ZONES).glob("thermal_zone*")):
        if (folder / "type").read_text().strip() == zone:
            return folder
    raise LookupError(f"no thermal zone {zone!r} under {root}")


class ThermalPlant:
    """The heat curve, trip points and clock step of one zone, written by a thread while it runs."""

    def __init__(self, root: str | Path, start_c: float, steady_c: float, tau_s: float, trip_c: float = 95.0,
                 critical_c: float = 105.0, throttled_hz: int | None = None, initial_hz: int | None = None,
                 zone: str = "gpu-thermal", tick_s: float = 0.05):
        self.root, self.start_c, self.steady_c, self.tau_s = Path(root), start_c, steady_c, tau_s
        self.trip_c, self.critical_c, self.throttled_hz, self.tick_s = trip_c, critical_c, throttled_hz, tick_s
        self.initial_hz = initial_hz
        self.folder = zone_folder(root, zone)
        self.clock = gpu_devfreq(root) / "cur_freq"
        self.started_at: float | None = None  # time.time() of t = 0
        self.throttled_at_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thermal-plant", daemon=True)
        for index, (kind, temp_c) in enumerate((("passive", trip_c), ("critical", critical_c))):
            _replace(self.folder / f"trip_point_{index}_type", kind)
            _replace(self.folder / f"trip_point_{index}_temp", int(temp_c * 1000))
        _replace(self.folder / "temp", int(start_c * 1000))
        if initial_hz:  # from the first call on (the plant is made before the job runs, heats once entered)
            _replace(self.clock, initial_hz)

    def temperature(self, t: float) -> float:
        return self.steady_c - (self.steady_c - self.start_c) * math.exp(-t / self.tau_s)

    def throttle_at_s(self) -> float | None:
        """The planted moment the zone reaches its passive trip point (None: it never does)."""
        if self.steady_c <= self.trip_c:
            return None
        return -self.tau_s * math.log((self.steady_c - self.trip_c) / (self.steady_c - self.start_c))

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.time() - self.started_at
            temp = self.temperature(t)
            _replace(self.folder / "temp", int(temp * 1000))
            if self.throttled_hz and self.throttled_at_s is None and temp >= self.trip_c:
                _replace(self.clock, self.throttled_hz)
                self.throttled_at_s = t
            self._stop.wait(self.tick_s)

    def __enter__(self) -> "ThermalPlant":
        self.started_at = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

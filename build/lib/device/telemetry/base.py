"""The sampler base: a thread that reads a source at a fixed rate between start() and stop()."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from device.errors import ConfigError


# numpy 2 renamed trapz; JetPack's Python may still carry numpy 1.x.
_trapezoid = getattr(np, "trapezoid", None) or np.trapz


@dataclass
class Trace:
    """Timestamped samples of one window.

    Attributes:
        times_s: Sample times in seconds (monotonic clock).
        values: One array per named quantity, aligned with ``times_s``; NaN where a read lacked it.
        requested_hz: The sampling rate asked for.
        errors: Read failures seen during the window (a lost telemetry source is recorded, not raised).
    """

    times_s: np.ndarray
    values: dict[str, np.ndarray]
    requested_hz: float
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_samples(cls, samples: list[tuple[float, dict[str, float]]], requested_hz: float,
                     errors: list[str] | None = None) -> "Trace":
        keys = sorted({key for _, values in samples for key in values})
        times = np.array([t for t, _ in samples], dtype=np.float64)
        values = {key: np.array([v.get(key, np.nan) for _, v in samples], dtype=np.float64) for key in keys}
        return cls(times, values, requested_hz, list(errors or []))

    @property
    def duration_s(self) -> float:
        return float(self.times_s[-1] - self.times_s[0]) if len(self.times_s) > 1 else 0.0

    @property
    def achieved_hz(self) -> float:
        """Samples per second actually taken (compare with ``requested_hz``)."""
        return (len(self.times_s) - 1) / self.duration_s if self.duration_s > 0 else 0.0

    def mean(self, key: str) -> float:
        """Time-weighted mean (the integral over the duration), not the mean of the samples."""
        if self.duration_s <= 0:
            return float(np.nanmean(self.values[key])) if key in self.values and len(self.values[key]) else float("nan")
        return self.integral(key) / self.duration_s

    def peak(self, key: str) -> float:
        return float(np.nanmax(self.values[key])) if key in self.values and len(self.values[key]) else float("nan")

    def integral(self, key: str) -> float:
        """Trapezoidal time integral of ``key`` over the window (power in mW → energy in mJ)."""
        if key not in self.values or len(self.times_s) < 2:
            return float("nan")
        values, times = self.values[key], self.times_s
        valid = ~np.isnan(values)
        if valid.sum() < 2:
            return float("nan")
        return float(_trapezoid(values[valid], times[valid]))


def energy_per_inference(trace: Trace, inferences: int, power_key: str = "power_mw",
                         idle_mw: float | None = None) -> dict[str, float]:
    """Energy per inference in millijoules, total and above the idle baseline.

    Args:
        trace: The timed window's trace.
        inferences: Images processed during the window.
        power_key: Which power series to integrate (a board's total rail on a Jetson).
        idle_mw: Mean power of the idle baseline taken before the window.
    """
    if inferences <= 0:
        raise ConfigError(f"inferences must be positive, got {inferences}")
    total = trace.integral(power_key)
    result = {"energy_mj_per_inference": total / inferences}
    if idle_mw is not None:
        result["energy_above_idle_mj_per_inference"] = (total - idle_mw * trace.duration_s) / inferences
    return result


class Sampler(ABC):
    """Reads one telemetry source at ``rate_hz`` on its own thread between start() and stop().

    Subclasses implement :meth:`read`; ``open``/``close`` acquire and release the source.
    """

    name = "sampler"

    def __init__(self, rate_hz: float = 10.0):
        if not 0 < rate_hz <= 1000:
            raise ConfigError(f"sampling rate must be in (0, 1000] Hz, got {rate_hz}")
        self.rate_hz = rate_hz
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._samples: list[tuple[float, dict[str, float]]] = []
        self._errors: dict[str, int] = {}  # message → how often (a dead source fails every tick)

    def open(self) -> None:
        """Acquires the source (connects to jtop, initialises NVML …)."""

    def close(self) -> None:
        """Releases the source."""

    @abstractmethod
    def read(self) -> dict[str, float]:
        """One sample of named values, units in the names."""

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} sampler already running")
        self._samples, self._errors = [], {}
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-sampler", daemon=True)
        self._sample()  # a sample at the very start fences the window
        self._thread.start()

    def stop(self) -> Trace:
        """Stops sampling (with a last sample at the very end) and returns the window's trace."""
        if self._thread is None:
            raise RuntimeError(f"{self.name} sampler is not running")
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()
        errors = [message if count == 1 else f"{message} (×{count})" for message, count in self._errors.items()]
        return Trace.from_samples(self._samples, self.rate_hz, errors)

    def _sample(self) -> None:
        stamp = time.monotonic()  # when the read began: closest to when the sensor was read
        try:
            values = self.read()
        except Exception as err:  # a dying source (jtop's raw EOFError) is a telemetry failure, not a crash
            message = f"{type(err).__name__}: {err}"
            self._errors[message] = self._errors.get(message, 0) + 1
            return
        self._samples.append((stamp, values))

    def _loop(self) -> None:
        period = 1.0 / self.rate_hz
        next_at = time.monotonic() + period
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self._sample()
            next_at += period

    def __enter__(self) -> "Sampler":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.close()

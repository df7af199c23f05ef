"""The sampler base: a thread that reads a source between start() and stop(), and the window arithmetic.

Every sample is stamped with when its value was measured (the middle of the read for a source read
on the spot; the source's own data time where it publishes one, as jtop does), repeated
measurements are kept once, and a window's energy integrates exactly the window: the power series
is linear between samples, interpolated at the window's edges, and only time that fresh samples
cover counts. Coverage, the largest gap and the staleness of values travel with every figure, and
a figure from a window that falls short is marked degraded with the reason.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from device.errors import ConfigError


# numpy 2 renamed trapz; JetPack's Python may still carry numpy 1.x.
_trapezoid = getattr(np, "trapezoid", None) or np.trapz

# Two samples further apart than this many sample intervals leave the time between them uncovered
# (jtop itself gives up on its service after 3 missed intervals).
GAP_FACTOR = 2.5
# A freshest value older than this many intervals is stale (jtop's own ok() gives up after 3).
STALE_INTERVALS = 3.0
# Below this coverage an energy figure is degraded; below COVERAGE_MIN none is published at all.
COVERAGE_OK = 0.95
COVERAGE_MIN = 0.5
# Above this relative uncertainty (the sampling's own bound) an energy figure is degraded.
UNCERTAINTY_OK = 0.02


@dataclass
class Trace:
    """Timestamped samples of one window.

    Attributes:
        times_s: When each value was measured, seconds on the monotonic clock, increasing.
        values: One array per named quantity, aligned with ``times_s``; NaN where a read lacked it.
        requested_hz: The sampling rate asked for.
        errors: Read failures seen during the window (a lost telemetry source is recorded, not raised).
        window: (start, stop) of the sampled window on the same clock; samples may lie just outside it
            (the last one before and the first one after), for interpolation at the edges.
        gap_limit_s: Two samples further apart than this leave the time between them uncovered.
        flags: Named conditions that degrade the window (``service_lost``, ``stale``, ``jtop_not_ok``…)
            with a sentence each.
        staleness_max_s: The oldest the freshest value got while the window ran.
        stamp_uncertainty_s: How far a stamp may be from when its value was measured.
    """

    times_s: np.ndarray
    values: dict[str, np.ndarray]
    requested_hz: float
    errors: list[str] = field(default_factory=list)
    window: tuple[float, float] | None = None
    gap_limit_s: float | None = None
    flags: dict[str, str] = field(default_factory=dict)
    staleness_max_s: float = 0.0
    stamp_uncertainty_s: float = 0.0

    @classmethod
    def from_samples(cls, samples: list[tuple[float, dict[str, float]]], requested_hz: float,
                     errors: list[str] | None = None, **kwargs: Any) -> "Trace":
        keys = sorted({key for _, values in samples for key in values})
        times = np.array([t for t, _ in samples], dtype=np.float64)
        values = {key: np.array([v.get(key, np.nan) for _, v in samples], dtype=np.float64) for key in keys}
        return cls(times, values, requested_hz, list(errors or []), **kwargs)

    @property
    def duration_s(self) -> float:
        return float(self.times_s[-1] - self.times_s[0]) if len(self.times_s) > 1 else 0.0

    @property
    def achieved_hz(self) -> float:
        """Distinct measurements per second actually obtained (compare with ``requested_hz``)."""
        return (len(self.times_s) - 1) / self.duration_s if self.duration_s > 0 else 0.0

    def mean(self, key: str) -> float:
        """Time-weighted mean (the integral over the duration), not the mean of the samples."""
        if self.duration_s <= 0:
            return float(np.nanmean(self.values[key])) if key in self.values and len(self.values[key]) else float("nan")
        return self.integral(key) / self.duration_s

    def peak(self, key: str) -> float:
        return float(np.nanmax(self.values[key])) if key in self.values and len(self.values[key]) else float("nan")

    def low(self, key: str) -> float:
        """The lowest reading (NaN when never read)."""
        values = self.values.get(key)
        return float(np.nanmin(values)) if values is not None and np.isfinite(values).any() else float("nan")

    def integral(self, key: str) -> float:
        """Trapezoidal time integral of ``key`` over all samples (power in mW → energy in mJ)."""
        if key not in self.values or len(self.times_s) < 2:
            return float("nan")
        values, times = self.values[key], self.times_s
        valid = ~np.isnan(values)
        if valid.sum() < 2:
            return float("nan")
        return float(_trapezoid(values[valid], times[valid]))

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(times, values) of ``key`` where it was read."""
        if key not in self.values:
            return np.empty(0), np.empty(0)
        valid = np.isfinite(self.values[key])
        return self.times_s[valid], self.values[key][valid]

    def gap_limit(self) -> float:
        return self.gap_limit_s if self.gap_limit_s else GAP_FACTOR / self.requested_hz


def _merge(pieces: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for lo, hi in sorted(p for p in pieces if p[1] > p[0]):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def covered_intervals(times: np.ndarray, start: float, stop: float, gap_limit: float) -> list[tuple[float, float]]:
    """The parts of [start, stop] that fresh samples cover.

    The time between two samples at most ``gap_limit`` apart is covered; each value also stands for
    one sample interval (``gap_limit / GAP_FACTOR``) on either side of it, so a source read just after
    the window opened, one that died, or one back from a stall covers the interval its value stood for.
    """
    if len(times) == 0:
        return []
    hold = gap_limit / GAP_FACTOR
    pieces = [(float(a), float(b)) for a, b in zip(times[:-1], times[1:]) if b - a <= gap_limit]
    pieces += [(float(t) - hold, float(t) + hold) for t in times]
    clipped = [(max(lo, start), min(hi, stop)) for lo, hi in pieces]
    return _merge(clipped)


def largest_gap(times: np.ndarray, start: float, stop: float) -> float:
    """The longest stretch of the window without a fresh sample, counting the samples bracketing it."""
    if len(times) == 0:
        return stop - start
    first = max(0, int(np.searchsorted(times, start, side="right")) - 1)
    last = min(len(times), int(np.searchsorted(times, stop, side="left")) + 1)
    inside = times[first:last]
    gaps = list(np.diff(inside)) if len(inside) > 1 else []
    if inside[0] > start:
        gaps.append(inside[0] - start)
    if inside[-1] < stop:
        gaps.append(stop - inside[-1])
    return float(max(gaps)) if gaps else 0.0


def integrate_over(times: np.ndarray, values: np.ndarray, pieces: Sequence[tuple[float, float]]) -> float:
    """Exact integral of the piecewise-linear series (held beyond its ends) over the given intervals."""
    total = 0.0
    for lo, hi in pieces:
        inner = times[(times > lo) & (times < hi)]
        at = np.concatenate(([lo], inner, [hi]))
        total += float(_trapezoid(np.interp(at, times, values), at))
    return total


def sampling_uncertainty(times: np.ndarray, values: np.ndarray, pieces: Sequence[tuple[float, float]],
                         stamp_uncertainty_s: float = 0.0) -> float:
    """A bound on the integral's error from sampling, in the integral's units.

    Between two samples the true series may step anywhere; the linear reconstruction is then off
    by at most |Δv|·Δt/2 on that interval, and by |Δv| times the stamps' own uncertainty. Independent
    intervals add in quadrature (noise averages out), a single step or an edge counts in full.
    """
    terms = []
    for a, b, va, vb in zip(times[:-1], times[1:], values[:-1], values[1:]):
        overlap = sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in pieces)
        if overlap > 0:
            terms.append(abs(vb - va) * (overlap / 2 + stamp_uncertainty_s))
    return float(np.sqrt(np.sum(np.square(terms)))) if terms else 0.0


def images_in(pieces: Sequence[tuple[float, float]], calls: Sequence[tuple[float, float, int]]) -> float:
    """Images processed in the covered time: each call's images, in proportion to its covered part."""
    if not len(calls) or not pieces:
        return 0.0
    begin, end, images = np.asarray(calls, dtype=np.float64).reshape(-1, 3).T
    overlap = np.zeros_like(begin)
    inside = np.zeros(begin.shape, dtype=bool)
    for lo, hi in pieces:
        overlap += np.clip(np.minimum(end, hi) - np.maximum(begin, lo), 0.0, None)
        inside |= (lo <= begin) & (begin <= hi)
    length = end - begin
    # A call too short to time counts whole where it began.
    share = np.where(length > 0, overlap / np.where(length > 0, length, 1.0), inside.astype(np.float64))
    return float(np.sum(images * share))


def window_energy(trace: Trace, start: float, stop: float, calls: Sequence[tuple[float, float, int]],
                  power_key: str | None = None, counter_key: str | None = None,
                  idle_mw: float | None = None) -> dict[str, Any]:
    """Energy over exactly [start, stop], per image, with its coverage and why it is degraded, if it is.

    Args:
        trace: The sampler's trace of the window (samples may bracket it).
        start: When the window opened (monotonic seconds).
        stop: When it closed.
        calls: (begin, end, images) of every inference call in the window, on the same clock.
        power_key: The power series (mW) to integrate.
        counter_key: A cumulative energy counter (mJ) to difference instead (NVML's), when present.
        idle_mw: The idle baseline's mean power, for the energy above idle.

    Returns:
        ``energy_mj_per_image`` and ``energy_above_idle_mj_per_image`` (None when coverage is
        below ``COVERAGE_MIN``), ``window_power_mw`` (mean over the covered time), ``coverage``,
        ``max_gap_s``, ``staleness_s``, ``covered_images``, ``energy_uncertainty_rel``,
        ``energy_method``, ``degraded`` and ``degraded_reasons`` ({flag: sentence}).
    """
    length = max(stop - start, 1e-12)
    gap = trace.gap_limit()
    key = counter_key if counter_key and counter_key in trace.values else power_key
    times, values = trace.series(key) if key else (np.empty(0), np.empty(0))
    pieces = covered_intervals(times, start, stop, gap)
    covered = sum(hi - lo for lo, hi in pieces)
    reasons = dict(trace.flags)
    result: dict[str, Any] = {"coverage": covered / length, "max_gap_s": largest_gap(times, start, stop),
                              "staleness_s": trace.staleness_max_s, "window_s": stop - start,
                              "energy_mj_per_image": None, "energy_above_idle_mj_per_image": None,
                              "window_power_mw": None, "covered_images": None, "energy_uncertainty_rel": None}
    if key == counter_key and len(times):
        # A cumulative counter needs no coverage in between: the difference across each covered
        # stretch is the energy spent in it, however the driver averaged the power it reports.
        energy = sum(float(np.interp(hi, times, values) - np.interp(lo, times, values)) for lo, hi in pieces)
        uncertainty = 0.0
        result["energy_method"] = f"difference of the {counter_key} counter"
    else:
        energy = integrate_over(times, values, pieces) if len(times) else float("nan")
        uncertainty = (sampling_uncertainty(times, values, pieces, trace.stamp_uncertainty_s) if len(times)
                       else float("nan"))
        result["energy_method"] = f"integral of {key} over the covered time" if key else None
    if result["coverage"] < COVERAGE_OK:
        reasons["low_coverage"] = (f"fresh samples cover {result['coverage']:.0%} of the window (largest gap "
                                   f"{result['max_gap_s']:.2f} s; need {COVERAGE_OK:.0%})")
    images = images_in(pieces, calls)
    if covered > 0 and np.isfinite(energy):
        result["window_power_mw"] = energy / covered
        result["energy_uncertainty_rel"] = uncertainty / abs(energy) if energy else None
        if result["energy_uncertainty_rel"] and result["energy_uncertainty_rel"] > UNCERTAINTY_OK:
            reasons["undersampled"] = (f"sampling leaves ±{result['energy_uncertainty_rel']:.1%} on the energy "
                                       f"({trace.achieved_hz:.0f} Hz over {length:.2f} s; lengthen the window "
                                       "or raise sample_hz)")
    if result["coverage"] >= COVERAGE_MIN and images > 0 and np.isfinite(energy):
        result["covered_images"] = images
        result["energy_mj_per_image"] = energy / images
        if idle_mw is not None and np.isfinite(idle_mw):
            result["energy_above_idle_mj_per_image"] = (energy - idle_mw * covered) / images
    elif "low_coverage" in reasons:
        reasons["low_coverage"] += "; too little to publish an energy figure"
    result["degraded"] = bool(reasons)
    result["degraded_reasons"] = reasons
    return result


class Sampler(ABC):
    """Reads one telemetry source at ``rate_hz`` on its own thread between start() and stop().

    Subclasses implement :meth:`read`; ``open``/``close`` acquire and release the source. A source
    that publishes its own measurements (jtop) overrides :meth:`sample_now` to hand back each
    measurement with the time it was taken.
    """

    name = "sampler"
    # Whether the window's end needs a measurement taken after it (a source that publishes on its
    # own clock); the protocol keeps the device busy until one arrives.
    needs_post_sample = False
    # How far a stamp may lie from the measurement (a source's own data time can be coarse).
    stamp_uncertainty_s = 0.0

    def __init__(self, rate_hz: float = 10.0):
        if not 0 < rate_hz <= 1000:
            raise ConfigError(f"sampling rate must be in (0, 1000] Hz, got {rate_hz}")
        self.rate_hz = rate_hz
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._samples: list[tuple[float, dict[str, float]]] = []
        self._errors: dict[str, int] = {}  # message → how often (a dead source fails every tick)
        self._flags: dict[str, str] = {}
        self._max_age = 0.0
        self._window: tuple[float, float] | None = None

    @property
    def gap_limit_s(self) -> float:
        """Samples further apart than this leave the time between them uncovered."""
        return GAP_FACTOR / self.rate_hz

    @property
    def stale_limit_s(self) -> float:
        """The freshest value older than this means the source stalled: three intervals, jtop's own limit."""
        return STALE_INTERVALS * self.gap_limit_s / GAP_FACTOR

    def open(self) -> None:
        """Acquires the source (connects to jtop, initialises NVML …)."""

    def close(self) -> None:
        """Releases the source."""

    @abstractmethod
    def read(self) -> dict[str, float]:
        """One sample of named values, units in the names."""

    def sample_now(self) -> list[tuple[float, dict[str, float]]]:
        """New measurements as (when measured, values); by default one read, stamped at its middle."""
        before = time.monotonic()
        values = self.read()
        return [((before + time.monotonic()) / 2, values)]

    def latest_stamp(self) -> float | None:
        """When the newest measurement the source holds was taken."""
        return self._samples[-1][0] if self._samples else None

    def flag(self, name: str, reason: str) -> None:
        """Marks the running window degraded (the first reason given for a flag is kept)."""
        self._flags.setdefault(name, reason)

    def record_error(self, err: BaseException) -> None:
        message = f"{type(err).__name__}: {err}"
        self._errors[message] = self._errors.get(message, 0) + 1
        self.flag("service_lost", f"the {self.name} source failed during the window ({message})")

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} sampler already running")
        self._samples, self._errors, self._flags, self._max_age = [], {}, {}, 0.0
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-sampler", daemon=True)
        started = time.monotonic()
        self._sample()  # the measurement standing at the very start fences the window
        # Only the last measurement before the window matters (interpolation at its edge).
        before = [i for i, (t, _) in enumerate(self._samples) if t <= started]
        if before:
            self._samples = self._samples[before[-1]:]
        self._window = (started, started)
        self._thread.start()

    def stop(self) -> Trace:
        """Stops sampling and returns the window's trace, with a measurement taken after its end."""
        if self._thread is None:
            raise RuntimeError(f"{self.name} sampler is not running")
        stopped = time.monotonic()
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()
        self._track_age(stopped)
        # A source publishing on its own clock delivers the measurement after the window within an
        # interval; wait for it (not for a dead one) so the window's end is interpolated, not guessed.
        deadline = stopped + self.gap_limit_s
        while ((not self._samples or self._samples[-1][0] < stopped) and "service_lost" not in self._flags
               and time.monotonic() < deadline):
            time.sleep(min(0.01, 0.25 / self.rate_hz))
            self._sample()
        self._window = (self._window[0], stopped)
        if self._max_age > self.stale_limit_s:
            self.flag("stale", f"the freshest {self.name} value was {self._max_age:.2f} s old at worst "
                               f"(limit {self.stale_limit_s:.2f} s): the source stalled")
        errors = [message if count == 1 else f"{message} (×{count})" for message, count in self._errors.items()]
        return Trace.from_samples(self._samples, self.rate_hz, errors, window=self._window,
                                  gap_limit_s=self.gap_limit_s, flags=dict(self._flags),
                                  staleness_max_s=self._max_age, stamp_uncertainty_s=self.stamp_uncertainty_s)

    def _track_age(self, now: float) -> None:
        latest = self.latest_stamp()
        if latest is not None:
            self._max_age = max(self._max_age, now - latest)
        elif self._window is not None:
            self._max_age = max(self._max_age, now - self._window[0])

    def _sample(self) -> None:
        try:
            batch = self.sample_now()
        except Exception as err:  # a dying source (jtop's raw EOFError) is a telemetry failure, not a crash
            self.record_error(err)
            batch = []
        for stamp, values in batch:
            if self._samples and stamp <= self._samples[-1][0]:
                continue  # the same measurement handed out again (a stalled source repeats itself)
            self._samples.append((stamp, values))

    def _loop(self) -> None:
        period = 1.0 / self.rate_hz
        next_at = time.monotonic() + period
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self._sample()
            self._track_age(time.monotonic())
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


def static_facts(samplers) -> dict[str, dict[str, Any]]:
    """What each telemetry sampler knows before it samples (its rails, the board, the service's versions)."""
    return {s.name: {k: getattr(s, k) for k in ("board_rail", "summed_rails", "nvpmodel", "jetson_clocks", "board",
                                                "gpu_name", "service_interval_s", "delivered_interval_s", "data_time",
                                                "service_version", "client_version", "unsupported", "rapl_readable",
                                                "provenance")
                     if hasattr(s, k)}
            for s in samplers}

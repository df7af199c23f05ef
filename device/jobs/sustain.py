"""After ten minutes: one rung's engine run without pause, recorded interval by interval.

One telemetry window (:func:`device.jobs.measure.telemetry_window`) spans the run, the engine never idle between its
intervals; each interval is its slice of it and its calls: their latency percentiles and throughput, the board's power
and energy per image, the temperatures (the samplers' series and the kernel's thermal zones), the GPU's lowest clock,
and the throttle signals — a zone at or past one of
its passive trip points (``/sys/devices/virtual/thermal/thermal_zone*/trip_point_*``, which jtop does not expose),
NVML's clock-event reasons, a GPU clock below the first interval's. The run stops early, and says so, when a zone
comes within the agent's margin of its critical trip point, or when the job's timeout is near (``stop_by``: what it
recorded is kept). Before it, a spec's ``cool_below_c`` waits idle for the zones to cool; the temperature it starts
at is recorded either way. A sweep's runs ask :class:`SustainedTime` whether the next setting still fits. Only numpy
and the samplers here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from device.telemetry.contention import NVML_THROTTLE_MASK
from device.errors import ConfigError, DeviceError
from device.jobs.measure import telemetry_window
from device.jobs.sustain_schema import SustainedSpec
from device.telemetry import series
from device.telemetry.base import COVERAGE_MIN, window_energy

THERMAL_DIR = "/sys/devices/virtual/thermal"
# An interval's median GPU clock under this share of the first interval's peak is a throttle signal. The median, not
# the lowest reading: without jetson_clocks the GPU runs under its DVFS governor and jtop reads the instantaneous
# cur_freq (jetson-stats 7.2.2, core/gpu.py), so one sample of a governor's dip is no throttle; a throttle holds.
# With an even count the upper of the two middle readings: on a loaded host an interval held two samples, one in a
# dip, and their mean (70 of 100 and 40 MHz, a clock the GPU never ran at) read as a throttle.
CLOCK_DROP = 0.95
NVML_POWER_MASK = 0x4 | 0x80  # SwPowerCap, HwPowerBrakeSlowdown (NVML's clock-event reasons)
WARMUP_CALLS = 3


class NoIntervalError(DeviceError):
    """A sustained run left no time to record one interval (the job's timeout came first)."""


class SustainedTime:
    """A sustained job's time within its timeout, as a sweep asks it (``budget`` of :func:`device.jobs.sweep.run_sweep`).

    Args:
        spec: The job's sustained spec.
        settle_s: The sweep's settle timeout (each setting may take that long to show).
        timeout_s: The job's effective timeout.
        stop_by: ``time.monotonic()`` by which the last run must end (the timeout less the result and the restore).
    """

    def __init__(self, spec: SustainedSpec, settle_s: float | None, timeout_s: float | None, stop_by: float | None):
        self.spec, self.settle_s, self.timeout_s, self.stop_by = spec, settle_s, timeout_s, stop_by
        self.ran_out = False  # a setting was left unset, or a run had no time for an interval

    def check(self, settings: int) -> None:
        """Raises :class:`ConfigError` when ``settings`` runs (a sweep of ``all`` modes, counted on the board) do
        not fit the timeout, before anything is changed."""
        if self.timeout_s and self.spec.budget_s(settings, self.settle_s) > self.timeout_s:
            raise ConfigError(f"{self.spec.budget_text(settings, self.settle_s)} is past the job's timeout "
                              f"{self.timeout_s:g} s (this board's modes × jetson_clocks states give {settings} "
                              "settings, those that need a reboot counted though they are skipped)",
                              fix="name the modes to sweep, run shorter, or give the job a longer timeout_s")

    def late(self) -> str | None:
        """Why the next setting is left unset (the time left is under its settling and one interval), or None."""
        if self.stop_by is None:
            return None
        left, need = self.stop_by - time.monotonic(), (self.settle_s or 0.0) + self.spec.record_every_s
        if left >= need:
            return None
        self.ran_out = True
        return (f"the job's timeout left {max(0.0, left):.0f} s, under the {need:g} s a setting needs (settling and "
                "one interval)")


def thermal_zones(thermal_dir: str | Path = THERMAL_DIR) -> dict[str, Path]:
    """Each readable thermal zone by its type (``cpu-thermal``, ``gpu-thermal``, …) → its folder."""
    zones = {}
    for folder in sorted(Path(thermal_dir).glob("thermal_zone*")):
        try:
            zones.setdefault((folder / "type").read_text().strip(), folder)
        except OSError:
            continue
    return zones


def trip_points(zones: dict[str, Path]) -> list[dict[str, Any]]:
    """Every trip point the zones list: ``trip_point_N_type`` and ``trip_point_N_temp`` (millidegrees); a placeholder
    at or below 0 °C (a driver's unused trip, THERMAL_TEMP_INVALID) is left out."""
    trips = []
    for zone, folder in zones.items():
        for type_file in sorted(folder.glob("trip_point_*_type")):
            try:
                temp = int((folder / type_file.name.replace("_type", "_temp")).read_text()) / 1000
                if temp > 0:
                    trips.append({"zone": zone, "type": type_file.read_text().strip(), "temp_c": temp})
            except (OSError, ValueError):
                continue
    return trips


def zone_temps(zones: dict[str, Path]) -> dict[str, float]:
    """Each zone's temperature now, °C (a zone that cannot be read is left out)."""
    temps = {}
    for zone, folder in zones.items():
        try:
            temps[zone] = int((folder / "temp").read_text()) / 1000
        except (OSError, ValueError):
            continue
    return temps


def _percentiles(latencies: list[float]) -> dict[str, float]:
    """p50, p90 and p99, ms, and the p50's 95% interval from the order statistics of the calls (the binomial
    interval of the median: no resampling)."""
    ms = np.sort(np.asarray(latencies) * 1000)
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    half = 1.96 * np.sqrt(len(ms)) / 2
    low, high = int(np.floor(len(ms) / 2 - half)), int(np.ceil(len(ms) / 2 + half))
    return {"latency_p50_ms": float(p50), "latency_p90_ms": float(p90), "latency_p99_ms": float(p99),
            "latency_p50_low_ms": float(ms[max(0, low)]), "latency_p50_high_ms": float(ms[min(len(ms) - 1, high)])}


def _over(traces, key: str, start: float, stop: float, how: str) -> float | None:
    """A series' peak, low, median or bits ORed (a flags mask) over [start, stop] from the first sampler that read it there
    (else its last reading before ``stop``: a source slower than the interval), or None."""
    for trace in traces:
        if key not in trace.values:
            continue
        first, last = np.searchsorted(trace.times_s, [start, stop], side="left")[0], \
            np.searchsorted(trace.times_s, stop, side="right")
        values = trace.values[key]
        inside = values[first:last][np.isfinite(values[first:last])]
        if not len(inside):
            before = values[:last][np.isfinite(values[:last])]
            inside = before[-1:]
        if len(inside):
            if how == "or":
                return float(np.bitwise_or.reduce(inside.astype(np.int64)))
            if how == "median":  # the upper middle reading: a clock the GPU ran at, never the mean of two
                return float(np.sort(inside)[len(inside) // 2])
            return float(inside.max() if how == "peak" else inside.min())
    return None


def _interval(raw: dict[str, Any], batch: int, traces, samplers, power_key: tuple[str, str] | None,
              trips: list[dict[str, Any]], first_clock: float | None) -> dict[str, Any]:
    """One interval's record from its calls, the run's traces over its span and the zones' temperatures at its end.

    ``first_clock`` is the GPU clock's peak in the first interval (its reference: a board still ramping from idle in
    its first seconds would set a low one)."""
    start, stop, latencies, temps = raw["start"], raw["stop"], raw["latencies"], raw["temps"]
    images, seconds = len(latencies) * batch, stop - start
    record: dict[str, Any] = {"end_s": raw["end_s"], "calls": len(latencies), "images": images,
                              **_percentiles(latencies), "throughput_images_per_s": images / seconds,
                              "power_mw": None, "energy_mj_per_image": None}
    if power_key is not None:
        trace = next(t for s, t in zip(samplers, traces) if s.name == power_key[0])
        if power_key[1] in trace.values:
            energy = window_energy(trace, start, stop, [], power_key=power_key[1])
            mean = energy["window_power_mw"]
            # As the ladder's windows: no figure from a source that covered under half the interval.
            if mean is not None and np.isfinite(mean) and energy["coverage"] >= COVERAGE_MIN:
                record.update(power_mw=mean, energy_mj_per_image=mean * seconds / images)
    record["gpu_temp_c"] = _over(traces, series.GPU_TEMP, start, stop, "peak") or temps.get("gpu-thermal")
    record["cpu_temp_c"] = _over(traces, series.temperature("cpu"), start, stop, "peak") or temps.get("cpu-thermal")
    record["hottest_c"] = max(temps.values()) if temps else None
    record["gpu_clock_mhz"] = _over(traces, series.GPU_FREQ, start, stop, "low")
    record["gpu_clock_median_mhz"] = _over(traces, series.GPU_FREQ, start, stop, "median")
    signals = [f"temperature: {t['zone']} at {temps[t['zone']]:.1f} °C, past its {t['type']} trip point "
               f"{t['temp_c']:.1f} °C" for t in trips
               if t["type"] in ("passive", "hot") and temps.get(t["zone"], -1e9) >= t["temp_c"]]
    reasons = int(_over(traces, series.THROTTLE_REASONS, start, stop, "or") or 0)
    if reasons & NVML_POWER_MASK:
        signals.append(f"power: NVML clock-event reasons {reasons:#x} (a power cap)")
    if reasons & NVML_THROTTLE_MASK & ~NVML_POWER_MASK:
        signals.append(f"temperature: NVML clock-event reasons {reasons:#x} (a thermal or hardware slowdown)")
    clock = record["gpu_clock_median_mhz"]
    if clock is not None and first_clock and clock < CLOCK_DROP * first_clock:
        signals.append(f"clock: the GPU at {clock:.0f} MHz (the interval's median), {first_clock:.0f} in the first "
                       "interval")
    record["signals"] = signals
    return record


def first_throttle(intervals: list[dict[str, Any]]) -> dict[str, Any]:
    """The first interval with a throttle signal, and its cause: a temperature trip before a power cap before a
    clock drop with neither reported."""
    for interval in intervals:
        if interval["signals"]:
            kinds = [signal.split(":", 1)[0] for signal in interval["signals"]]
            cause = next(kind for kind in ("temperature", "power", "clock") if kind in kinds)
            return {"first_throttle_s": interval["end_s"], "throttle_cause": cause,
                    "throttle_text": f"after {interval['end_s'] / 60:.1f} min: {'; '.join(interval['signals'])}"}
    return {"first_throttle_s": None, "throttle_cause": "none", "throttle_text": "no throttle signal in the run"}


def cool_down(zones: dict[str, Path], below_c: float, max_s: float, stop_by: float | None,
              progress: Callable[[str], None]) -> str:
    """Waits idle until every zone is below ``below_c`` (at most ``max_s``, and never past ``stop_by``); what it did."""
    started = time.monotonic()
    until = min(started + max_s, stop_by if stop_by is not None else float("inf"))
    hottest = max(zone_temps(zones).values(), default=None)
    if hottest is None:
        return f"no thermal zone to read: started at once (cool_below_c {below_c:g} °C)"
    first = hottest
    while hottest >= below_c and time.monotonic() < until:
        progress(f"sustained: cooling, hottest zone {hottest:.1f} °C, waiting for {below_c:g} °C")
        time.sleep(min(1.0, max(0.0, until - time.monotonic())))
        hottest = max(zone_temps(zones).values(), default=hottest)
    waited = time.monotonic() - started
    if hottest >= below_c:
        return f"still {hottest:.1f} °C after {waited:.0f} s (cool_below_c {below_c:g} °C): started hotter"
    return f"cooled from {first:.1f} to {hottest:.1f} °C in {waited:.0f} s" if waited >= 0.5 else \
        f"already below {below_c:g} °C ({hottest:.1f} °C)"


def run_sustained(runner, spec: SustainedSpec, chw: Sequence[int], samplers, power_key: tuple[str, str] | None,
                  thermal_dir: str | Path = THERMAL_DIR, margin_c: float = 5.0,
                  progress: Callable[[str], None] = lambda text: None, stop_by: float | None = None) -> dict[str, Any]:
    """Runs ``runner`` on one batch without pause for ``spec.minutes``, one record per ``spec.record_every_s``.

    Args:
        samplers: Open telemetry samplers (each interval starts and stops them).
        power_key: (sampler name, series) of the board's power, or None without a power source.
        thermal_dir: The kernel's thermal zones (a simulated board's in tests).
        margin_c: Stop when a zone comes within this of its critical trip point.
        stop_by: ``time.monotonic()`` by which the run must end (the job's timeout less what the result needs): a run
            cut there keeps its intervals and says so in ``stopped_early``.

    Returns:
        A :class:`device.jobs.sustain_schema.SustainedResult` as a dict.
    """
    zones = thermal_zones(thermal_dir)
    trips, critical, not_measured = _limits(zones, thermal_dir, power_key)
    cooling = (cool_down(zones, spec.cool_below_c, spec.cooling_limit_s(),
                         None if stop_by is None else stop_by - spec.record_every_s, progress)
               if spec.cool_below_c is not None else None)  # cooling leaves the run one interval at least
    batch = np.random.default_rng(0).standard_normal((spec.batch_size, *chw)).astype(np.float32)
    for _ in range(WARMUP_CALLS):
        runner.infer(batch)
    start_hottest = max(zone_temps(zones).values(), default=None)
    progress(f"sustained: started, {spec.minutes:g} min at batch {spec.batch_size}")
    started, started_at = time.monotonic(), time.time()
    deadline = min(started + spec.minutes * 60, stop_by if stop_by is not None else float("inf"))
    if deadline - started < spec.record_every_s / 2:  # under half an interval: no interval of its own (_intervals)
        raise NoIntervalError(f"the sustained run had no time to record an interval: the job's timeout was "
                              f"{max(0.0, deadline - started):.1f} s away when it could start"
                              + (f" ({cooling})" if cooling else ""),
                              fix="give the job a longer timeout_s (deploy.job_timeout_s), or a shorter cool_max_s")
    raw: list[dict[str, Any]] = []
    near_critical: list[str] = []

    def near(temps: dict[str, float]) -> list[str]:
        return [f"stopped after {(time.monotonic() - started) / 60:.1f} min: {zone} at {temps[zone]:.1f} °C, within "
                f"{margin_c:g} °C of its critical trip point {limit:.1f} °C"
                for zone, limit in critical.items() if temps.get(zone, -1e9) >= limit - margin_c]

    def run() -> None:
        """Interval after interval on a fixed grid, the engine never idle between them; the zones read every
        second, and one near its critical trip point ends the run there."""
        index = 0
        while time.monotonic() < deadline - 1e-3 and not near_critical:
            index += 1
            start, latencies = time.monotonic(), []
            until, checked = min(started + index * spec.record_every_s, deadline), start
            while (not latencies or time.monotonic() < until) and not near_critical:
                begun = time.perf_counter()
                runner.infer(batch)
                latencies.append(time.perf_counter() - begun)
                if critical and time.monotonic() - checked >= 1.0:
                    checked = time.monotonic()
                    near_critical.extend(near(zone_temps(zones)))
            stop, temps = time.monotonic(), zone_temps(zones)
            near_critical.extend([] if near_critical else near(temps))
            raw.append({"start": start, "stop": stop, "end_s": stop - started, "latencies": latencies, "temps": temps})
            progress(f"sustained: {(stop - started) / 60:.1f}/{spec.minutes:g} min, p50 "
                     f"{1000 * float(np.median(latencies)):.2f} ms"
                     + (f", hottest zone {max(temps.values()):.1f} °C" if temps else ""))

    # One telemetry window for the whole run (its traces sliced per interval after it): no pause between intervals;
    # after a stop near the critical trip point nothing more runs.
    _, traces = telemetry_window(samplers, run,
                                 keep_busy=lambda: time.sleep(0.01) if near_critical else runner.infer(batch))
    intervals = _intervals(raw, spec, traces, samplers, power_key, trips)
    if intervals and intervals[0]["gpu_clock_mhz"] is None:
        not_measured.append("GPU clock: no sampler reads it here (jtop or NVML)")
    cut = (f"stopped after {_span(raw[-1]['end_s'])} of {_span(spec.minutes * 60)}: the job's timeout was near; the "
           "intervals so far are kept" if not near_critical and deadline < started + spec.minutes * 60 else None)
    return {"spec": spec.model_dump(exclude_none=True), "started_at": started_at, "intervals": intervals,
            "trip_points": trips, "stopped_early": near_critical[0] if near_critical else cut,
            "not_measured": not_measured, "start_hottest_c": start_hottest, "cooling": cooling,
            **first_throttle(intervals)}


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _intervals(raw: list[dict[str, Any]], spec: SustainedSpec, traces, samplers, power_key,
               trips: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each interval's record; a short tail (under half an interval) joins the one before it, not "settled"."""
    if len(raw) > 1 and raw[-1]["stop"] - raw[-1]["start"] < spec.record_every_s / 2:
        tail = raw.pop()
        raw[-1].update(stop=tail["stop"], end_s=tail["end_s"], temps=tail["temps"],
                       latencies=raw[-1]["latencies"] + tail["latencies"])
    intervals: list[dict[str, Any]] = []
    reference = None
    for record in raw:
        intervals.append(_interval(record, spec.batch_size, traces, samplers, power_key, trips, reference))
        if reference is None:
            reference = _over(traces, series.GPU_FREQ, record["start"], record["stop"], "peak")
    return intervals


def _limits(zones: dict[str, Path], thermal_dir, power_key) -> tuple[list[dict[str, Any]], dict[str, float], list[str]]:
    """The zones' trip points, each zone's lowest critical one, and what the run cannot measure here."""
    trips = trip_points(zones)
    critical: dict[str, float] = {}
    for trip in trips:
        if trip["type"] == "critical":
            critical[trip["zone"]] = min(trip["temp_c"], critical.get(trip["zone"], trip["temp_c"]))
    not_measured = [] if power_key else ["power: no power telemetry on this device (jtop or NVML)"]
    if not zones:
        not_measured.append(f"temperatures and trip points: no thermal zones under {thermal_dir}")
    elif not trips:
        not_measured.append(f"trip points: the thermal zones under {thermal_dir} list none")
    return trips, critical, not_measured

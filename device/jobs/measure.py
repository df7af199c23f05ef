"""The measurement protocol: idle baseline, warm-up, then the timed window with telemetry fenced to it.

Every number carries its unit in its name. Latency is per batch (one ``infer`` call), throughput
is images over the window's wall time, and energy is the time integral of the chosen power series
(or the difference of an energy counter, NVML's) over exactly the window, per image, in total and
above the idle baseline, counted only over the time fresh samples cover and with the images
processed in that time; a window that falls short is marked degraded with the reason
(:func:`device.telemetry.base.window_energy`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from device.telemetry import contention
from device.errors import ConfigError
from device.runners.base import Runner
from device.schema import RunResult
from device.jobs.window import DeviceTiming, PowerTrace, SeriesStats, TelemetrySummary
from device.telemetry import series
from device.telemetry.base import Sampler, Trace, window_energy


@dataclass(frozen=True)
class MeasureSpec:
    """How long and how hard to measure.

    Attributes:
        warmup_iterations: Untimed calls first (engine autotuning, caches, clocks ramping up).
        iterations: Timed calls; ``duration_s`` instead runs for a wall-clock time.
        duration_s: Timed window length, when ``iterations`` is None.
        idle_s: Idle baseline before warm-up, with the samplers running.
        temp_limit_c: A temperature above this during the window is reported.
        min_iterations: A ``duration_s`` window goes on until at least this many calls were timed.
    """

    warmup_iterations: int = 10
    iterations: int | None = 100
    duration_s: float | None = None
    idle_s: float = 1.0
    temp_limit_c: float = 85.0
    min_iterations: int = 2

    def __post_init__(self) -> None:
        if (self.iterations is None) == (self.duration_s is None):
            raise ConfigError("give exactly one of iterations and duration_s")
        if self.iterations is not None and self.iterations < 2:
            raise ConfigError(f"iterations must be ≥ 2 for percentiles, got {self.iterations}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError(f"duration_s must be positive, got {self.duration_s}")
        if self.warmup_iterations < 0 or self.idle_s < 0:
            raise ConfigError("warmup_iterations and idle_s must not be negative")


def latency_stats(latencies_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/mean/std in milliseconds and the coefficient of variation."""
    ms = np.asarray(latencies_s, dtype=np.float64) * 1e3
    mean = float(ms.mean())
    return {"latency_p50_ms": float(np.percentile(ms, 50)), "latency_p90_ms": float(np.percentile(ms, 90)),
            "latency_p99_ms": float(np.percentile(ms, 99)), "latency_mean_ms": mean,
            "latency_std_ms": float(ms.std(ddof=1)), "latency_cv": float(ms.std(ddof=1) / mean) if mean else 0.0}


def device_timing(calls_ms: Sequence[dict[str, float]], method: str) -> DeviceTiming | None:
    """trtexec's device-side times over the timed calls.

    Args:
        calls_ms: One ``{"latency_ms", "gpu_compute_ms"}`` per timed call (``runner.last_device_ms``).
        method: How the runner took them (for the report).
    """
    if not calls_ms:
        return None
    out: dict[str, Any] = {"method": method}
    for key, name in (("latency_ms", "latency"), ("gpu_compute_ms", "gpu_compute")):
        values = np.asarray([call[key] for call in calls_ms], dtype=np.float64)
        out.update({f"{name}_p50_ms": float(np.percentile(values, 50)), f"{name}_p90_ms": float(np.percentile(values, 90)),
                    f"{name}_p99_ms": float(np.percentile(values, 99)), f"{name}_mean_ms": float(values.mean())})
    return DeviceTiming(**out)


def power_trace(trace: Trace, key: str, idle_mw: float | None, source: str,
                max_samples: int = 400, start: float | None = None) -> dict[str, Any]:
    """The window's power series, thinned to at most ``max_samples`` samples, for plotting."""
    origin = trace.times_s[0] if start is None else start
    times, values = trace.times_s - origin, trace.values[key]
    step = max(1, int(np.ceil(len(times) / max_samples)))
    keep = np.isfinite(values[::step])
    return {"source": source, "key": key, "t_s": [round(float(t), 4) for t in times[::step][keep]],
            "mw": [round(float(v), 1) for v in values[::step][keep]], "idle_mw": idle_mw}


def telemetry_window(samplers: Sequence[Sampler], work, keep_busy=None) -> tuple[Any, list[Trace]]:
    """Runs ``work`` with the samplers sampling; ``keep_busy`` is called after the work until every
    source that publishes on its own clock has a measurement from after the window's end."""
    for sampler in samplers:
        sampler.start()
    try:
        result = work()
        if keep_busy is not None:
            ended = time.monotonic()
            waiting = [s for s in samplers if s.needs_post_sample]
            deadline = ended + max((s.gap_limit_s for s in waiting), default=0.0)
            # The device stays loaded past the window so the measurement after it shows the
            # window's power, and the interpolation at the edge is not pulled towards idle.
            while waiting and time.monotonic() < deadline:
                waiting = [s for s in waiting if (s.latest_stamp() or 0.0) < ended]
                if waiting:
                    keep_busy()
    finally:
        traces = [sampler.stop() for sampler in samplers]
    return result, traces


def counter_key(sampler: Sampler, trace: Trace) -> str | None:
    """The sampler's cumulative energy counter, when it has one and it was read."""
    key = getattr(sampler, "energy_counter_key", None)
    return key if key and key in trace.values else None


def measure(runner: Runner, batch: np.ndarray, spec: MeasureSpec, samplers: Sequence[Sampler] = (),
            power_key: str | None = None, facts: dict[str, dict[str, Any]] | None = None) -> RunResult:
    """Measures ``runner`` on ``batch`` (already loaded); samplers must be open.

    Args:
        runner: A loaded runner.
        batch: The input (its first axis is the batch size).
        spec: Iterations or duration, warm-up and idle baseline.
        samplers: Telemetry samplers, started for the idle baseline and for the timed window only.
        power_key: The power series (mW) to integrate for energy, e.g. ``board_power_mw``.
        facts: Per sampler name, what it says of the device (board rail, nvpmodel …), recorded with its series.

    Returns:
        The window as the result schema's :class:`~device.schema.RunResult` (its ``summary`` and
        ``noise_flags`` are the job's to fill: :func:`device.jobs.jobrun.summarize`).
    """
    images_per_call = int(batch.shape[0])
    idle_means: dict[str, float] = {}
    idle_power: dict[str, float] = {}
    if samplers and spec.idle_s > 0:
        _, idle_traces = telemetry_window(samplers, lambda: time.sleep(spec.idle_s))
        for sampler, trace in zip(samplers, idle_traces):
            idle_means.update({key: trace.mean(key) for key in trace.values})
            key = power_key if power_key in trace.values else None
            if key or counter_key(sampler, trace):
                # The idle power over exactly the idle window, from the counter where there is one
                # (NVML's reported power is a 1 s average on recent GPUs: it smears a 1 s baseline).
                idle = window_energy(trace, trace.window[0], trace.window[1], [], power_key=key,
                                     counter_key=counter_key(sampler, trace))
                if idle["window_power_mw"] is not None and idle["coverage"] >= 0.5:
                    idle_power[sampler.name] = idle["window_power_mw"]
    for _ in range(spec.warmup_iterations):
        runner.infer(batch)

    calls: list[tuple[float, float, int]] = []
    bounds: list[float] = []

    window_contention: list = []

    device_ms: list[dict[str, float]] = []

    def timed() -> tuple[list[float], float]:
        latencies: list[float] = []
        window_contention.append(contention.snapshot())
        started = time.perf_counter()
        bounds.append(time.monotonic())
        while True:
            before = time.perf_counter()
            begin = time.monotonic()
            runner.infer(batch)
            latencies.append(time.perf_counter() - before)
            calls.append((begin, time.monotonic(), images_per_call))
            if getattr(runner, "last_device_ms", None):
                device_ms.append(runner.last_device_ms)
            if spec.iterations is not None and len(latencies) >= spec.iterations:
                break
            if spec.duration_s is not None and time.perf_counter() - started >= spec.duration_s \
                    and len(latencies) >= spec.min_iterations:
                break
        window_s = time.perf_counter() - started
        bounds.append(time.monotonic())
        window_contention.append(contention.between(window_contention[0], contention.snapshot()))
        return latencies, window_s

    (latencies, window_s), traces = telemetry_window(samplers, timed, keep_busy=lambda: runner.infer(batch))
    start, stop = bounds
    images = len(latencies) * images_per_call
    telemetry: dict[str, TelemetrySummary] = {}
    power: dict[str, Any] = {}
    for sampler, trace in zip(samplers, traces):
        summary, trace_of_power = _telemetry_summary(sampler, trace, start, stop, calls, spec, power_key,
                                                     idle_means, idle_power.get(sampler.name), (facts or {}).get(sampler.name))
        telemetry[sampler.name] = summary
        power = power or ({"power_trace": trace_of_power} if trace_of_power else {})
    return RunResult(batch_size=images_per_call, iterations=len(latencies), images=images, window_s=window_s,
                     throughput_images_per_s=images / window_s, **latency_stats(latencies), telemetry=telemetry,
                     contention=window_contention[1],
                     device_timing=device_timing(device_ms, getattr(runner, "timing_method", ""))
                     if len(device_ms) == len(latencies) else None, **power)


def _telemetry_summary(sampler: Sampler, trace: Trace, start: float, stop: float, calls, spec: MeasureSpec,
                       power_key: str | None, idle_means: dict[str, float], idle_mw: float | None,
                       facts: dict[str, Any] | None) -> tuple[TelemetrySummary, PowerTrace | None]:
    """One source over the window: each series' statistics, its clocks and temperatures checked, and the
    energy over exactly the window when it measures power."""
    inside = (trace.times_s >= start) & (trace.times_s <= stop)
    stats = {}
    for key in trace.values:
        values = trace.values[key][inside]
        # The low (a clock's dip) over the window's own samples; a slow source may have none inside.
        low = float(np.nanmin(values)) if np.isfinite(values).any() else trace.low(key)
        stats[key] = {"mean": trace.mean(key), "peak": trace.peak(key), "low": low, "idle": idle_means.get(key)}
    clocks = series.of_kind(trace.values, "clock")
    fields: dict[str, Any] = {
        "staleness_s": trace.staleness_max_s,  # the energy's own, over the window, replaces it below
        "clocks_dropped": any(np.nanmin(trace.values[k]) < 0.95 * np.nanmax(trace.values[k]) for k in clocks
                              if np.isfinite(trace.values[k]).any()),
        "temp_limit_crossed": any(trace.peak(k) > spec.temp_limit_c for k in series.of_kind(trace.values, "temperature"))}
    plot = None
    counter = counter_key(sampler, trace)
    if (power_key and power_key in trace.values) or counter:
        key = power_key if power_key in trace.values else None
        energy = window_energy(trace, start, stop, calls, power_key=key, counter_key=counter, idle_mw=idle_mw)
        fields.update(energy, power_key=key)
        if key:
            # Mean and peak over the window itself, not the samples bracketing it.
            if energy["window_power_mw"] is not None:
                stats[key]["mean"] = energy["window_power_mw"]
            if inside.any() and np.isfinite(trace.values[key][inside]).any():
                stats[key]["peak"] = float(np.nanmax(trace.values[key][inside]))
            if idle_mw is not None:
                stats[key]["idle"] = idle_mw
            plot = PowerTrace(**power_trace(trace, key, idle_mw, sampler.name, start=start))
    summary = TelemetrySummary(source=sampler.name, samples=len(trace.times_s), samples_in_window=int(inside.sum()),
                               requested_hz=trace.requested_hz, achieved_hz=trace.achieved_hz, errors=trace.errors,
                               flags=dict(trace.flags), series={key: SeriesStats(**values) for key, values in stats.items()},
                               facts=facts or {}, **fields)
    return summary, plot

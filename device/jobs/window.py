"""What one timed window measured: its telemetry per source, its summary (power, energy, memory, temperatures,
clocks), its power trace, what else used the device, and trtexec's own times.

Every measured document reads leniently and writes strictly (:class:`Measured`); the fields the report shows are
declared here, once (:func:`device.reported.reported`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from device.reported import reported

TelemetryName = Literal["host", "nvml", "jtop"]


class Measured(BaseModel):
    """A measured document: unknown keys refused when written (a renamed field fails loudly, not as missing);
    dropped when read with :data:`device.schema.READING` as context (a newer minor version's addition)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_newer_keys(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and info.context and info.context.get("reading"):
            known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
            return {key: value for key, value in data.items() if key in known}
        return data


class SeriesStats(Measured):
    """One telemetry series (``board_power_mw``, ``temp_gpu_c``, ``gpu_freq_mhz`` …) over the timed window."""

    mean: float | None = None
    peak: float | None = None
    low: float | None = Field(None, description="the lowest reading (over the window's own samples, when it has some)")
    idle: float | None = Field(None, description="mean over the idle baseline before the job")


class TelemetrySummary(Measured):
    """One telemetry source over one timed window, with the quality of what it measured."""

    source: TelemetryName
    samples: int
    samples_in_window: int
    requested_hz: float | None = None
    achieved_hz: float | None = None
    errors: list[str] = Field(default_factory=list, description="read failures (a repeated one with its count)")
    flags: dict[str, Any] = Field(default_factory=dict)
    staleness_s: float | None = Field(None, description="age of the stalest value used, from the source's own clock")
    clocks_dropped: bool = False
    temp_limit_crossed: bool = False
    series: dict[str, SeriesStats] = Field(default_factory=dict)
    # Energy over exactly the window (None where this source measures no power).
    power_key: str | None = None
    coverage: float | None = Field(None, description="fraction of the window fresh samples cover")
    max_gap_s: float | None = None
    window_s: float | None = None
    window_power_mw: float | None = None
    covered_images: float | None = Field(None, description="images timed within covered time (calls cut by a "
                                                           "gap count in part)")
    energy_mj_per_image: float | None = None
    energy_above_idle_mj_per_image: float | None = None
    energy_method: str | None = None
    energy_uncertainty_rel: float | None = None
    degraded: bool | None = None
    degraded_reasons: dict[str, str] = Field(default_factory=dict)
    facts: dict[str, Any] = Field(default_factory=dict, description="what the source says of the device: board "
                                                                    "rail, nvpmodel, jetson_clocks, provenance …")

    def peak_temperatures_c(self) -> dict[str, float]:
        """Peak temperature per thermal zone (:func:`device.telemetry.series.describe`)."""
        from device.telemetry.series import describe

        temps = {}
        for key, stats in self.series.items():
            info = describe(key)
            if info.kind == "temperature" and stats.peak is not None and stats.peak == stats.peak:  # NaN: no reading
                temps[info.zone] = stats.peak
        return temps


class RunSummary(Measured):
    """The headline numbers of one batch size, from the best source present (board power first)."""

    power_source: str | None = None
    power_mean_mw: float | None = reported(
        "the mean power over the timed window (the summary's power source)", label="W", fmt=".2f", combine="median",
        batch="throughput", column="power_mean_w", scale=1e-3)
    power_peak_mw: float | None = reported("the highest power reading in the timed window (the summary's power source)",
                                           label="power peak mW", fmt=".0f", combine="max")
    power_idle_mw: float | None = None
    energy_mj_per_image: float | None = reported(
        "energy per image over the timed window", label="mJ/image", fmt=".2f", combine="median", batch="throughput",
        interval=("energy_low_mj", "energy_high_mj"), windows="energy_windows_mj", ladder=True)
    energy_above_idle_mj_per_image: float | None = None
    energy_method: str | None = None
    energy_coverage: float | None = None
    power_max_gap_s: float | None = None
    power_staleness_s: float | None = None
    power_sample_hz: float | None = None
    energy_degraded: bool | None = None
    energy_degraded_reasons: dict[str, str] = Field(default_factory=dict)
    memory_source: str | None = None
    peak_memory_mb: float | None = reported("the memory the job's engine held at its peak", label="peak MB",
                                            fmt=".0f", combine="max")
    gpu_temp_peak_c: float | None = reported(
        "the GPU's peak temperature during the timed window (jtop's gpu zone, NVML's GPU sensor)",
        label="GPU °C peak", fmt=".1f", combine="max", since=1, series="temp_gpu_c", stat="peak")
    gpu_freq_low_mhz: float | None = reported(
        "the GPU's lowest clock during the timed window: below the mode's maximum, DVFS or throttling slowed it",
        label="GPU MHz low", fmt=".0f", combine="min", since=1, series="gpu_freq_mhz", stat="low")


class PowerTrace(Measured):
    """The window's power series, thinned for plotting."""

    source: str
    key: str
    t_s: list[float]
    mw: list[float]
    idle_mw: float | None = None


class Contention(Measured):
    """What else used the device during a timed window (device.telemetry.contention)."""

    other_cpu_cores: float | None = Field(None, description="CPU time of other processes, in cores, on average")
    loadavg_1m: float | None = None
    cpus: int | None = None
    cpu_freq_mhz_min: float | None = None
    cpu_freq_mhz_max: float | None = None
    governor: str | None = None


class DeviceTiming(Measured):
    """The timed calls as trtexec reports them (TensorRT only), beside the wall time of the whole call.

    ``latency_*`` is trtexec's "Latency" (host-to-device copy + GPU compute + device-to-host copy, CUDA
    events, pinned buffers); ``gpu_compute_*`` is its "GPU Compute Time" (events around the enqueue). One
    inference in flight, synchronized after each call: trtexec ``--exposeDMA``, not its overlapped default.
    """

    method: str = Field("", description="how the runner took the times")
    latency_p50_ms: float = reported(
        "trtexec's Latency, median call", ..., label="trtexec Latency p50 ms", fmt=".3f", combine="median",
        batch="latency", column="trt_latency_p50_ms", interval=("trt_latency_p50_low_ms", "trt_latency_p50_high_ms"))
    latency_p90_ms: float
    latency_p99_ms: float
    latency_mean_ms: float
    gpu_compute_p50_ms: float = reported(
        "trtexec's GPU Compute Time, median call", ..., label="GPU Compute p50 ms", fmt=".3f", combine="median",
        batch="latency", interval=("gpu_compute_p50_low_ms", "gpu_compute_p50_high_ms"))
    gpu_compute_p90_ms: float
    gpu_compute_p99_ms: float
    gpu_compute_mean_ms: float

"""A sustained job (``JobSpec.sustained``, recipe ``deploy.sustained``, ``edgefold sustain``): one rung's engine run
without pause for minutes, recorded interval by interval (:mod:`device.jobs.sustain`), and what it measured
(``JobResult.sustained``): each interval's latency, throughput, power, temperatures and GPU clock, the board's trip
points, and the first throttle signal with its cause. The burst and settled figures and their ratio are the build
host's (``pipeline.tasks.classification.sustain_report``), from these intervals."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from device.power.setting_schema import SWEEP_RESTORE_S, PowerSetting
from device.jobs.window import Measured

# What a sustained job needs besides its runs within its timeout: loading, the engine build, the smoke call, and
# the result (RESULT_RESERVE_S of it kept back from the last run: the samplers' last reads and closing, validating
# and writing it).
ALLOWANCE_S = 90.0
RESULT_RESERVE_S = 30.0
COOL_MAX_S = 300.0  # the longest wait for cool_below_c unless the spec says


class SustainedSpec(BaseModel):
    """How long to run the engine without pause, at which batch, and how often to record."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # as device.schema.Request
    minutes: float = Field(gt=0, le=24 * 60, description="how long to run the engine without pause")
    batch_size: int = Field(1, ge=1, le=4096, description="the batch each call runs (one of the job's batch_sizes)")
    record_every_s: float = Field(10.0, ge=0.2, le=3600, description="one recorded interval's length, s")
    cool_below_c: float | None = Field(None, ge=20, le=150, description="before each run (each swept setting's), "
                                       "wait idle until every thermal zone is below this, °C, so each starts from the "
                                       "same heat; null: start at once (the start's temperature is recorded either way)")
    # None rather than a default value: a result of a job that does not cool stays readable by a 2.10 reader.
    cool_max_s: float | None = Field(None, ge=1, le=3600, description="the longest wait for cool_below_c, s (null: "
                                     f"{COOL_MAX_S:g}): the run starts after it and says how hot it still was")

    @model_validator(mode="after")
    def _intervals(self) -> "SustainedSpec":
        if self.record_every_s > self.minutes * 60:
            raise ValueError(f"record_every_s {self.record_every_s:g} s is longer than the run ({self.minutes:g} min "
                             f"= {self.minutes * 60:g} s): record at most every {self.minutes * 60:g} s")
        if self.cool_max_s is not None and self.cool_below_c is None:
            raise ValueError("cool_max_s bounds the wait for cool_below_c: give cool_below_c too, or leave both out")
        return self

    def cooling_limit_s(self) -> float:
        """The longest wait for ``cool_below_c``, s."""
        return self.cool_max_s if self.cool_max_s is not None else COOL_MAX_S

    def runs_s(self, settings: int = 1, settle_s: float | None = None) -> float:
        """The time ``settings`` runs take: each one's minutes, its longest cooling wait, and in a sweep
        (``settle_s``: the sweep's settle timeout) its setting's settling and the restore of the mode found."""
        each = self.minutes * 60 + (self.cooling_limit_s() if self.cool_below_c is not None else 0.0)
        return settings * (each + (settle_s or 0.0)) + (SWEEP_RESTORE_S if settle_s is not None else 0.0)

    def budget_s(self, settings: int = 1, settle_s: float | None = None) -> float:
        """The time a job needs for ``settings`` runs: :meth:`runs_s`, and :data:`ALLOWANCE_S` once to load, build
        and write the result (a job that loads slower has its last run cut short, and says so)."""
        return self.runs_s(settings, settle_s) + ALLOWANCE_S

    def budget_text(self, settings: int = 1, settle_s: float | None = None) -> str:
        """How :meth:`budget_s` adds up, for a refusal."""
        parts = [f"{self.minutes * 60:g} s"] + ([f"up to {self.cooling_limit_s():g} s of cooling"]
                                                if self.cool_below_c is not None else []) + (
            [f"up to {settle_s:g} s to settle"] if settle_s else [])
        runs = (f"{settings} setting{'s' if settings > 1 else ''} × ({' and '.join(parts)})" if settle_s is not None
                else " and ".join(parts))
        restore = f", {SWEEP_RESTORE_S:g} s to restore the mode" if settle_s is not None else ""
        return (f"sustained.minutes {self.minutes:g} ({runs}{restore}, and {ALLOWANCE_S:g} s to load, build and write "
                "the result)")


class TripPoint(Measured):
    """One trip point of one thermal zone, as the kernel lists it (``thermal_zone*/trip_point_*``)."""

    zone: str = Field(description="the zone's type (cpu-thermal, gpu-thermal, …)")
    type: str = Field(description="passive, active, hot or critical")
    temp_c: float


class SustainedInterval(Measured):
    """One recorded interval: its calls' latency percentiles, throughput, and what telemetry saw in it."""

    end_s: float = Field(description="seconds from the start of the run to the interval's end")
    calls: int
    images: int
    latency_p50_ms: float
    latency_p50_low_ms: float = Field(description="the p50's 95% interval over the interval's calls (order statistics)")
    latency_p50_high_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    throughput_images_per_s: float
    power_mw: float | None = None
    energy_mj_per_image: float | None = Field(None, description="the interval's mean power × its time ÷ its images")
    gpu_temp_c: float | None = None
    cpu_temp_c: float | None = None
    hottest_c: float | None = Field(None, description="the hottest thermal zone at the interval's end, °C")
    gpu_clock_mhz: float | None = Field(None, description="the GPU clock's lowest reading in the interval")
    gpu_clock_median_mhz: float | None = Field(None, description="the GPU clock's median reading in the interval "
                                                                 "(the upper middle one of an even count): what the "
                                                                 "clock signal compares (2.12)")
    signals: list[str] = Field(default_factory=list, description="the throttle signals seen in the interval")


class SustainedResult(Measured):
    """A sustained run: its intervals, the board's trip points, the first throttle signal, and what could not be
    measured (a source the device lacks)."""

    spec: SustainedSpec
    power_setting: PowerSetting | None = Field(None, description="the swept setting it ran under (null: the mode "
                                                                 "it found) (2.11)")
    start_hottest_c: float | None = Field(None, description="the hottest thermal zone when the run started, °C (2.11)")
    cooling: str | None = Field(None, description="what the wait for cool_below_c did (2.11)")
    started_at: float = Field(description="the run's start (after warm-up), seconds since the epoch, device clock")
    intervals: list[SustainedInterval]
    trip_points: list[TripPoint]
    first_throttle_s: float | None = Field(None, description="the end of the first interval with a throttle signal "
                                                             "(None: none seen)")
    throttle_cause: Literal["temperature", "power", "clock", "none"] = Field(
        "none", description="temperature: a zone at or past a passive trip point; power: NVML's power-cap reasons; "
                            "clock: the GPU clock dropped with neither reported")
    throttle_text: str = ""
    stopped_early: str | None = Field(None, description="why the run stopped before its time (a zone near its "
                                                        "critical trip point; the job's timeout near)")
    not_measured: list[str] = Field(default_factory=list)

"""A PLANTED clock for tests only: simulated time that runs ``scale`` times faster than the host's, shared by the
test process (a :class:`tests.device.thermal_plant.ThermalPlant`) and an agent's job processes.

A sustained job of two minutes is two minutes of the job's clock: what the test checks (the throttle moment within
one recording interval, the settled-over-burst ratio) is a statement about that clock, not about the host's. Here
both sides read the same simulated time, ``origin + scale × (host − origin)`` for the monotonic and the wall
clock with one origin: a two-minute run lasts ``120 / scale`` seconds of the host's, and every figure it records is
in simulated seconds.

In a job process (the agent's ``device.service.zygote`` and ``device.jobs.jobrun``, never the agent itself) the clock replaces
``time.monotonic``, ``time.perf_counter``, ``time.time`` (and their ``_ns`` forms) and ``time.sleep`` (a simulated
second is ``1 / scale`` of the host's); it is installed by the ``sitecustomize`` of
:func:`tests.device.clocked_runtime.sitecustomize_dir` from ``EDGEFOLD_TEST_TIME_*`` variables, which nothing
outside these tests sets. ``CLOCK_BOOTTIME`` is moved a day away: the jtop service's uptime is the host's, so the
job's jtop sampler, finding it off its clock, stamps each measurement on arrival (on the simulated clock).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

ENV_SCALE, ENV_ORIGIN = "EDGEFOLD_TEST_TIME_SCALE", "EDGEFOLD_TEST_TIME_ORIGIN"
JOB_MODULES = (b"device.service.zygote", b"device.jobs.jobrun")  # the agent's job processes (/proc/self/cmdline)
BOOTTIME_AWAY_S = 86400.0
_HOST = {name: getattr(time, name) for name in ("monotonic", "perf_counter", "time", "sleep", "clock_gettime")}


@dataclass(frozen=True)
class TimeScale:
    """Simulated time ``scale`` times faster than the host's from ``origin`` (the host's monotonic and wall time).

    Attributes:
        scale: Simulated seconds per host second.
        origin_mono: The host's ``time.monotonic()`` where both clocks agree (CLOCK_MONOTONIC is system-wide).
        origin_wall: The host's ``time.time()`` at the same moment.
    """

    scale: float
    origin_mono: float
    origin_wall: float

    @classmethod
    def starting_now(cls, scale: float, lead_s: float = 60.0) -> "TimeScale":
        """A clock whose origin lies ``lead_s`` host seconds back: it reads ``(scale − 1) × lead_s`` ahead of the
        host's from the start, so a process left on the host's clock is minutes off and its figures fail the test."""
        return cls(scale, _HOST["monotonic"]() - lead_s, _HOST["time"]() - lead_s)

    @classmethod
    def from_environment(cls, environ=os.environ) -> "TimeScale | None":
        if ENV_SCALE not in environ:
            return None
        mono, wall = (float(value) for value in environ[ENV_ORIGIN].split(","))
        return cls(float(environ[ENV_SCALE]), mono, wall)

    def environment(self) -> dict[str, str]:
        """The variables that give an agent's job processes this clock."""
        return {ENV_SCALE: repr(self.scale), ENV_ORIGIN: f"{self.origin_mono!r},{self.origin_wall!r}"}

    def monotonic(self) -> float:
        return self.origin_mono + self.scale * (_HOST["monotonic"]() - self.origin_mono)

    def wall(self) -> float:
        return self.origin_wall + self.scale * (_HOST["time"]() - self.origin_wall)

    def sleep(self, seconds: float) -> None:
        _HOST["sleep"](max(0.0, seconds) / self.scale)

    def host_seconds(self, simulated_s: float) -> float:
        """How long ``simulated_s`` lasts on the host."""
        return simulated_s / self.scale

    def install(self) -> None:
        """Replaces this process's clocks by the simulated ones (no undo: a job process lives only for its job)."""
        perf_offset = _HOST["perf_counter"]() - _HOST["monotonic"]()  # 0 on Linux (both CLOCK_MONOTONIC)

        def clock_gettime(clock_id: int) -> float:
            if clock_id == time.CLOCK_MONOTONIC:
                return self.monotonic()
            if clock_id == getattr(time, "CLOCK_BOOTTIME", None):
                return self.monotonic() + BOOTTIME_AWAY_S
            return _HOST["clock_gettime"](clock_id)

        time.monotonic, time.time, time.sleep, time.clock_gettime = self.monotonic, self.wall, self.sleep, clock_gettime
        time.perf_counter = lambda: self.monotonic() + perf_offset
        time.monotonic_ns = lambda: int(self.monotonic() * 1e9)
        time.perf_counter_ns = lambda: int(time.perf_counter() * 1e9)
        time.time_ns = lambda: int(self.wall() * 1e9)


def install_in_job_process(cmdline: Path = Path("/proc/self/cmdline")) -> TimeScale | None:
    """What the ``sitecustomize`` runs: the environment's clock, in a job process only (None: not installed)."""
    scale = TimeScale.from_environment()
    try:
        is_job = scale is not None and any(name in cmdline.read_bytes() for name in JOB_MODULES)
    except OSError:
        is_job = False
    if not is_job:
        return None
    scale.install()
    return scale

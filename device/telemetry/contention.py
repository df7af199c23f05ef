"""Did something else use the device during a timed window? Contention read from the OS through psutil.

A busy period (another job, a compile, a browser) slows whichever rung it hits; without a record of
it a ratio between rungs is a coin toss. For each window this records the CPU time that *other*
processes used (all CPUs' busy time less this process's own, in cores), the load average, and the CPU
clock and governor where readable, so a noisy window is flagged with its cause, as trtexec warns on a
high coefficient of variation. Where the OS does not say (no cpufreq, no load average), a field is None.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from device.errors import require
from device.jobs.window import Contention, TelemetrySummary
from device.telemetry import series

# Other processes using more than this many cores on average, or a window CV above this, is noisy.
OTHER_CORES_LIMIT = 0.25
WINDOW_CV_LIMIT = 0.10


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    busy_s: float  # all CPUs: user + nice + system + irq + softirq + steal
    own_s: float  # this process and its waited-for children: user + system + children's user + system
    freq_mhz: tuple[float, ...]


def _psutil():
    # Lazily, as device.telemetry.host does: the pipeline imports this module's limits without the agent's extras.
    return require("psutil", "psutil", "pip install 'edgefold[device]'")


def snapshot() -> Snapshot:
    """CPU time so far (all CPUs' busy, this process's own) and every CPU's clock, now."""
    psutil = _psutil()
    cpu = psutil.cpu_times()
    # Fields other platforms lack count as 0 (psutil names only what the OS reports).
    busy = sum(getattr(cpu, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))
    own = psutil.Process().cpu_times()
    try:
        freqs = tuple(float(f.current) for f in psutil.cpu_freq(percpu=True) or () if f.current)
    except (NotImplementedError, OSError):  # no cpufreq on this machine (some VMs, containers)
        freqs = ()
    return Snapshot(time.monotonic(), busy, own.user + own.system + own.children_user + own.children_system, freqs)


def governor() -> str | None:
    """cpu0's frequency governor; read from sysfs because psutil does not report it."""
    try:
        return Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()
    except OSError:
        return None


def between(before: Snapshot, after: Snapshot) -> Contention:
    """What else ran between two snapshots."""
    wall = max(after.wall_s - before.wall_s, 1e-9)
    other = max(0.0, ((after.busy_s - before.busy_s) - (after.own_s - before.own_s)) / wall)
    try:
        load = _psutil().getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    freqs = before.freq_mhz + after.freq_mhz
    return Contention(other_cpu_cores=other, loadavg_1m=load, cpus=os.cpu_count(),
                      cpu_freq_mhz_min=min(freqs) if freqs else None, cpu_freq_mhz_max=max(freqs) if freqs else None,
                      governor=governor())


# NVML clock-event reasons that mean the GPU slowed itself (not idle, not an application clock setting):
# SwPowerCap 0x4, HwSlowdown 0x8, SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80.
NVML_THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def nvml_throttled(telemetry: TelemetrySummary) -> bool:
    """Whether an NVML sampler saw a throttling clock-event reason during the window."""
    reasons = telemetry.series.get(series.THROTTLE_REASONS)
    peak = reasons.peak if reasons else None
    return peak is not None and peak == peak and int(peak) & NVML_THROTTLE_MASK != 0


def noise_flags(contention_: Contention | None, latency_cv: float | None, clocks_dropped: bool = False,
                throttled: bool = False) -> dict[str, str]:
    """Why a window's numbers are noisy, each with the fix (trtexec-style): {flag: sentence}."""
    flags = {}
    other = contention_.other_cpu_cores if contention_ else None
    if other is not None and other > OTHER_CORES_LIMIT:
        flags["busy_device"] = (f"other processes used {other:.2f} CPU cores during the window; stop other work on "
                                "the device (or pin the benchmark to reserved cores)")
    if latency_cv is not None and latency_cv > WINDOW_CV_LIMIT:
        flags["high_variance"] = (f"latency CV {100 * latency_cv:.0f}% within the window (over "
                                  f"{100 * WINDOW_CV_LIMIT:.0f}%); lock clocks (jetson_clocks and a fixed nvpmodel on "
                                  "a Jetson, nvidia-smi --lock-gpu-clocks on a GPU server, the performance governor "
                                  "on a CPU)")
    if clocks_dropped:
        flags["clocks_dropped"] = "GPU/EMC clocks dropped during the window; run jetson_clocks and fix the nvpmodel"
    if throttled:
        flags["throttled"] = "the device throttled (temperature or power limit); cool it down and lock clocks"
    governor_ = contention_.governor if contention_ else None
    if governor_ and governor_ not in ("performance",) and latency_cv is not None and latency_cv > WINDOW_CV_LIMIT:
        flags["governor"] = f"CPU frequency governor {governor_!r}; set 'performance' for stable timings"
    return flags

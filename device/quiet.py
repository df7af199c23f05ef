"""Was the device quiet? What else used it during a timed window, read from the OS.

A busy period (another job, a compile, a browser) slows whichever rung it hits; without a record of
it a ratio between rungs is a coin toss. For each window this records the CPU time that *other*
processes used (all CPUs' busy time from ``/proc/stat`` less this process's own from
``/proc/self/stat``, in cores), the load average, and the CPU clock and governor where readable,
so a noisy window is flagged with its cause, as trtexec warns on a high coefficient of variation.
Linux only; elsewhere the fields are None.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# Other processes using more than this many cores on average, or a window CV above this, is noisy.
OTHER_CORES_LIMIT = 0.25
WINDOW_CV_LIMIT = 0.10


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    busy_ticks: int | None  # all CPUs: user + nice + system + irq + softirq + steal
    own_ticks: int | None  # this process and its waited-for children: utime + stime + cutime + cstime
    freq_mhz: tuple[float, ...]


def _busy_ticks() -> int | None:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    values = [int(v) for v in fields]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (values + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal


def _own_ticks() -> int | None:
    try:
        stat = Path("/proc/self/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime (fields 14–17)


def _frequencies() -> tuple[float, ...]:
    out = []
    for path in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq")):
        try:
            out.append(int(path.read_text()) / 1000.0)  # kHz
        except (OSError, ValueError):
            continue
    return tuple(out)


def snapshot() -> Snapshot:
    return Snapshot(time.monotonic(), _busy_ticks(), _own_ticks(), _frequencies())


def governor() -> str | None:
    try:
        return Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()
    except OSError:
        return None


def contention(before: Snapshot, after: Snapshot) -> dict:
    """What else ran between two snapshots, shaped as :class:`device.schema.Contention`."""
    wall = max(after.wall_s - before.wall_s, 1e-9)
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    other = None
    if None not in (before.busy_ticks, after.busy_ticks, before.own_ticks, after.own_ticks):
        busy = (after.busy_ticks - before.busy_ticks) / hz
        own = (after.own_ticks - before.own_ticks) / hz
        other = max(0.0, (busy - own) / wall)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    freqs = before.freq_mhz + after.freq_mhz
    return {"other_cpu_cores": other, "loadavg_1m": load, "cpus": os.cpu_count(),
            "cpu_freq_mhz_min": min(freqs) if freqs else None, "cpu_freq_mhz_max": max(freqs) if freqs else None,
            "governor": governor()}


# NVML clock-event reasons that mean the GPU slowed itself (not idle, not an application clock setting):
# SwPowerCap 0x4, HwSlowdown 0x8, SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80.
NVML_THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def nvml_throttled(telemetry: dict) -> bool:
    """Whether an NVML sampler saw a throttling clock-event reason during the window."""
    reasons = (telemetry.get("series") or {}).get("throttle_reasons") or {}
    peak = reasons.get("peak")
    return peak is not None and peak == peak and int(peak) & NVML_THROTTLE_MASK != 0


def noise_flags(contention_: dict | None, latency_cv: float | None, clocks_dropped: bool = False,
                throttled: bool = False) -> dict[str, str]:
    """Why a window's numbers are noisy, each with the fix (trtexec-style): {flag: sentence}."""
    flags = {}
    other = (contention_ or {}).get("other_cpu_cores")
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
    governor_ = (contention_ or {}).get("governor")
    if governor_ and governor_ not in ("performance",) and latency_cv is not None and latency_cv > WINDOW_CV_LIMIT:
        flags["governor"] = f"CPU frequency governor {governor_!r}; set 'performance' for stable timings"
    return flags

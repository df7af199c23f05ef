"""Every telemetry series name, in one place: what the samplers record and what a key means.

A series is a key in a sampler's readings (``board_power_mw``, ``temp_gpu_c``, ``rail_VDD_GPU_SOC_mw``).
The samplers build their keys from the names here, and :func:`describe` is the one parser of a key:
the measurement protocol (which series are clocks and temperatures), the result schema (peak
temperature per zone) and the summary (which series feed a reported figure) all ask it, so the GPU's
temperature is ``temp_gpu_c`` from jtop and from NVML alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["power", "energy", "temperature", "clock", "load", "memory", "flags"]

BOARD_POWER = "board_power_mw"          # jtop: the board's total (or its rails summed)
GPU_POWER = "power_mw"                  # NVML: the GPU board's power
GPU_ENERGY = "energy_mj"                # NVML: the driver's cumulative energy counter
HOST_ENERGY = "rapl_energy_uj"          # host: the RAPL package counter
GPU_TEMP = "temp_gpu_c"                 # one temperature zone: temperature("gpu")
GPU_FREQ = "gpu_freq_mhz"               # jtop's GPU frequency; NVML's SM clock
GPU_LOAD = "gpu_load_percent"
RAM_USED = "ram_used_mb"                # a Jetson's shared CPU/GPU memory
NVMAP = "nvmap_mb"
GPU_MEM_USED = "gpu_mem_used_mb"
PROCESS_RSS = "rss_mb"
PROCESS_CPU = "cpu_percent"
THROTTLE_REASONS = "throttle_reasons"   # NVML's clock-event reasons bit mask

_FIXED: dict[str, tuple[Kind, str]] = {
    BOARD_POWER: ("power", "mW"), GPU_POWER: ("power", "mW"), GPU_ENERGY: ("energy", "mJ"),
    HOST_ENERGY: ("energy", "µJ"), GPU_FREQ: ("clock", "MHz"), GPU_LOAD: ("load", "%"), PROCESS_CPU: ("load", "%"),
    RAM_USED: ("memory", "MB"), NVMAP: ("memory", "MB"), GPU_MEM_USED: ("memory", "MB"), PROCESS_RSS: ("memory", "MB"),
    THROTTLE_REASONS: ("flags", "bits"),
}
_TEMPERATURE = re.compile(r"^temp_(?P<zone>.+)_c$")
_RAIL = re.compile(r"^rail_(?P<zone>.+)_mw$")


@dataclass(frozen=True)
class SeriesInfo:
    """What a series key means: its kind, unit and, for a zone or rail, which one."""

    key: str
    kind: Kind | None
    unit: str | None
    zone: str | None = None


def temperature(zone: str) -> str:
    """The key of one thermal zone's temperature, °C (``temperature("gpu") == GPU_TEMP``)."""
    return f"temp_{zone}_c"


def rail(name: str) -> str:
    """The key of one power rail's power, mW."""
    return f"rail_{name}_mw"


def describe(key: str) -> SeriesInfo:
    """The one parser of a series key; an unknown key has kind None (kept, never guessed at)."""
    if key in _FIXED:
        kind, unit = _FIXED[key]
        return SeriesInfo(key, kind, unit)
    if match := _TEMPERATURE.match(key):
        return SeriesInfo(key, "temperature", "°C", match["zone"])
    if match := _RAIL.match(key):
        return SeriesInfo(key, "power", "mW", match["zone"])
    return SeriesInfo(key, None, None)


def of_kind(keys, kind: Kind) -> list[str]:
    """The keys among ``keys`` of one kind, in their order."""
    return [key for key in keys if describe(key).kind == kind]

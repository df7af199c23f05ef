"""The host sampler: this process's memory and CPU (psutil), package energy through RAPL where readable."""

from __future__ import annotations

import os
from pathlib import Path

from device.errors import require
from device.telemetry import series
from device.telemetry.base import Sampler

RAPL = Path("/sys/class/powercap/intel-rapl:0/energy_uj")


class HostSampler(Sampler):
    """Samples ``rss_mb`` and ``cpu_percent`` of a process, and ``rapl_energy_uj`` when readable.

    Args:
        rate_hz: Samples per second.
        pid: The process to watch (default: this one).
        rapl_path: The RAPL package energy counter (root-only on most kernels since 2020).
    """

    name = "host"

    def __init__(self, rate_hz: float = 10.0, pid: int | None = None, rapl_path: Path = RAPL):
        super().__init__(rate_hz)
        self.pid = pid or os.getpid()
        self.rapl_path = Path(rapl_path)
        self._process = None
        self.rapl_readable = False

    def open(self) -> None:
        psutil = require("psutil", "psutil", "pip install 'edgefold[device]'")
        self._process = psutil.Process(self.pid)
        self._process.cpu_percent(None)  # the first call primes the counter
        try:
            int(self.rapl_path.read_text())
            self.rapl_readable = True
        except (OSError, ValueError):
            self.rapl_readable = False

    def read(self) -> dict[str, float]:
        if self._process is None:
            self.open()
        values = {series.PROCESS_RSS: self._process.memory_info().rss / 2**20,
                  series.PROCESS_CPU: self._process.cpu_percent(None)}
        if self.rapl_readable:
            values[series.HOST_ENERGY] = float(int(self.rapl_path.read_text()))
        return values

"""The NVML sampler for data-center GPUs: power, the energy counter, memory, utilization, SM clock,
temperature and clock-throttle reasons.

Each query is probed once when the sampler opens; one that answers NOT_SUPPORTED (every power and
energy query on Tegra, the energy counter before Volta) is left out of the samples instead of
failing the window.
"""

from __future__ import annotations

from device.errors import MissingDependencyError, require
from device.telemetry.base import Sampler


class NvmlSampler(Sampler):
    """Samples GPU ``index`` through NVML.

    Values: ``power_mw``, ``energy_mj`` (the driver's cumulative counter), ``gpu_mem_used_mb``,
    ``gpu_util_percent``, ``sm_clock_mhz``, ``gpu_temp_c``, ``throttle_reasons`` (bit mask).
    """

    name = "nvml"

    def __init__(self, rate_hz: float = 10.0, index: int = 0):
        super().__init__(rate_hz)
        self.index = index
        self.supported: dict[str, object] = {}
        self.unsupported: list[str] = []
        self._nvml = None

    def _queries(self, nvml, handle) -> dict[str, object]:
        return {
            "power_mw": lambda: float(nvml.nvmlDeviceGetPowerUsage(handle)),
            "energy_mj": lambda: float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
            "gpu_mem_used_mb": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
            "gpu_util_percent": lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "sm_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            "gpu_temp_c": lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            "throttle_reasons": lambda: float(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
        }

    def open(self) -> None:
        nvml = require("pynvml", "nvidia-ml-py", "pip install 'edgefold[nvml]'")
        try:
            nvml.nvmlInit()
            handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
        except nvml.NVMLError as err:
            raise MissingDependencyError(f"NVML is not usable here: {err}",
                                         fix="install the NVIDIA driver, or use the host or jtop sampler") from None
        self._nvml = nvml
        for key, query in self._queries(nvml, handle).items():
            try:
                query()
                self.supported[key] = query
            except nvml.NVMLError:
                self.unsupported.append(key)

    def read(self) -> dict[str, float]:
        return {key: query() for key, query in self.supported.items()}

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None

"""The NVML sampler for data-center GPUs: power, the energy counter, memory, utilization, SM clock,
temperature and clock-event (throttle) reasons.

Energy comes from the driver's cumulative counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ,
differenced across the window), not from integrating ``nvmlDeviceGetPowerUsage``: on Ampere and
newer (except GA100) that power is a 1-second average, which smears short windows and a 1 s idle
baseline. The reported power is kept for display, and the provenance says which is which.
Clock-event reasons use ``nvmlDeviceGetCurrentClocksEventReasons`` where the binding has it (the
``…ThrottleReasons`` name is deprecated since NVML 12.2).

Each query is probed once when the sampler opens; one that answers NOT_SUPPORTED (every power and
energy query on Tegra, the energy counter before Volta) is left out of the samples instead of
failing the window.
"""

from __future__ import annotations

import os

from device.errors import MissingDependencyError, require
from device.telemetry import series
from device.telemetry.base import Sampler


def cuda_device_handle(pynvml, pci_bus_id: str | None):
    """The NVML handle of CUDA device 0 of this process.

    NVML numbers GPUs in PCI order; CUDA, under ``CUDA_VISIBLE_DEVICES`` (and its default
    FASTEST_FIRST order), may not — so NVML index 0 can be another GPU. Match by PCI bus id
    (``cudaDeviceGetPCIBusId``), else by the UUID ``CUDA_VISIBLE_DEVICES`` names, else by its index
    when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes the two orders agree.

    Raises:
        LookupError: ``CUDA_VISIBLE_DEVICES`` names an index and nothing says which NVML device it is.
    """
    if pci_bus_id:
        return pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(visible)
    if visible.isdigit() and os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return pynvml.nvmlDeviceGetHandleByIndex(int(visible))
    if visible:
        raise LookupError(f"CUDA_VISIBLE_DEVICES={visible} without a PCI bus id: NVML's index may name another GPU")
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def cuda_pci_bus_id() -> str | None:
    """CUDA device 0's PCI bus id from the CUDA runtime, where one is loadable and a device answers."""
    try:
        from device.runners.cuda import CudaRuntime

        return CudaRuntime().pci_bus_id(0)
    except Exception:  # no libcudart, no device: the caller falls back to the environment's rules
        return None


class NvmlSampler(Sampler):
    """Samples the GPU the job's runtime uses (CUDA device 0 of the process) through NVML.

    Values (:mod:`device.telemetry.series`): ``power_mw``, ``energy_mj`` (the driver's cumulative
    counter), ``gpu_mem_used_mb``, ``gpu_load_percent``, ``gpu_freq_mhz`` (the SM clock), ``temp_gpu_c``,
    ``throttle_reasons`` (the clock-event reasons bit mask). ``energy_counter_key`` names the counter when the GPU has one (the protocol
    then takes energy from it); ``provenance`` says where power and energy come from.
    """

    name = "nvml"

    def __init__(self, rate_hz: float = 10.0, pci_bus_id: str | None = None):
        """
        Args:
            rate_hz: Sampling rate.
            pci_bus_id: The PCI bus id of the GPU the runner uses (``runner.pci_bus_id``); None: asked of
                the CUDA runtime, else resolved from ``CUDA_VISIBLE_DEVICES`` (:func:`cuda_device_handle`).
        """
        super().__init__(rate_hz)
        self.pci_bus_id = pci_bus_id
        self.supported: dict[str, object] = {}
        self.unsupported: list[str] = []
        self._nvml = None
        self.energy_counter_key: str | None = None
        self.provenance: dict[str, str] = {}

    def _queries(self, nvml, handle) -> dict[str, object]:
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self.provenance["throttle_reasons"] = ("nvmlDeviceGetCurrentClocksEventReasons" if reasons else
                                               "nvmlDeviceGetCurrentClocksThrottleReasons (deprecated; old binding)")
        reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return {
            series.GPU_POWER: lambda: float(nvml.nvmlDeviceGetPowerUsage(handle)),
            series.GPU_ENERGY: lambda: float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
            series.GPU_MEM_USED: lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
            series.GPU_LOAD: lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            series.GPU_FREQ: lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            series.GPU_TEMP: lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            series.THROTTLE_REASONS: lambda: float(reasons(handle)),
        }

    def open(self) -> None:
        nvml = require("pynvml", "nvidia-ml-py", "pip install 'edgefold[nvml]'")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise MissingDependencyError(f"NVML is not usable here: {err}",
                                         fix="install the NVIDIA driver, or use the host or jtop sampler") from None
        if self.pci_bus_id is None:
            self.pci_bus_id = cuda_pci_bus_id()
        try:
            handle = cuda_device_handle(nvml, self.pci_bus_id)
        except (nvml.NVMLError, LookupError) as err:
            nvml.nvmlShutdown()
            raise MissingDependencyError(
                f"NVML cannot tell which GPU the job runs on: {err}",
                fix="set CUDA_DEVICE_ORDER=PCI_BUS_ID beside CUDA_VISIBLE_DEVICES, or name the GPU by UUID "
                    "(CUDA_VISIBLE_DEVICES=GPU-…, from nvidia-smi -L)") from None
        self.provenance["device"] = (f"PCI bus id {self.pci_bus_id}" if self.pci_bus_id else
                                     "CUDA_VISIBLE_DEVICES / NVML index 0")
        self._nvml = nvml
        for key, query in self._queries(nvml, handle).items():
            try:
                query()
                self.supported[key] = query
            except nvml.NVMLError:
                self.unsupported.append(key)
        if series.GPU_ENERGY in self.supported:
            self.energy_counter_key = series.GPU_ENERGY
            self.provenance["energy"] = "nvmlDeviceGetTotalEnergyConsumption (mJ counter), differenced across the window"
            self.provenance["power"] = ("nvmlDeviceGetPowerUsage, for display: a 1 s average on Ampere and newer "
                                        "(except GA100)")
        elif series.GPU_POWER in self.supported:
            self.provenance["energy"] = ("integral of nvmlDeviceGetPowerUsage (no energy counter before Volta); "
                                         "the driver may average it")

    def read(self) -> dict[str, float]:
        return {key: query() for key, query in self.supported.items()}

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None

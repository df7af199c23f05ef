"""The NVML sampler against a stand-in pynvml module: NVML needs an NVIDIA driver and GPU, which
this machine lacks. The stand-in follows pynvml's names, units (mW, mJ, bytes) and errors."""

import sys
import time
import types

import pytest

from device.errors import MissingDependencyError
from device.telemetry.base import energy_per_inference
from device.telemetry.nvml import NvmlSampler


class FakeNVMLError(Exception):
    pass


def fake_pynvml(energy_supported=True, init_fails=False):
    module = types.ModuleType("pynvml")
    start = time.monotonic()
    module.NVMLError = FakeNVMLError
    module.NVML_CLOCK_SM, module.NVML_TEMPERATURE_GPU = 1, 0
    module.shutdowns = 0

    def init():
        if init_fails:
            raise FakeNVMLError("Driver Not Loaded")

    def energy(handle):
        if not energy_supported:
            raise FakeNVMLError("Not Supported")
        return int(300_000 * (time.monotonic() - start))  # 300 W as a cumulative mJ counter

    module.nvmlInit = init
    module.nvmlShutdown = lambda: setattr(module, "shutdowns", module.shutdowns + 1)
    module.nvmlDeviceGetHandleByIndex = lambda index: ("gpu", index)
    module.nvmlDeviceGetPowerUsage = lambda handle: 300_000
    module.nvmlDeviceGetTotalEnergyConsumption = energy
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=3 * 2**30, total=141 * 2**30)
    module.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=97, memory=40)
    module.nvmlDeviceGetClockInfo = lambda handle, kind: 1980
    module.nvmlDeviceGetTemperature = lambda handle, kind: 51
    module.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: 0
    return module


def test_samples_every_supported_query(monkeypatch):
    module = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    with NvmlSampler(rate_hz=50) as sampler:
        sampler.start()
        time.sleep(0.25)
        trace = sampler.stop()
    assert sampler.unsupported == [] and module.shutdowns == 1
    assert trace.mean("power_mw") == pytest.approx(300_000)
    assert trace.peak("gpu_mem_used_mb") == 3072 and trace.peak("sm_clock_mhz") == 1980
    # Integrated power and the driver's energy counter agree (both 300 W over the window).
    counted = trace.values["energy_mj"][-1] - trace.values["energy_mj"][0]
    assert trace.integral("power_mw") == pytest.approx(counted, rel=0.05)
    assert energy_per_inference(trace, 1000, idle_mw=60_000)["energy_above_idle_mj_per_inference"] > 0


def test_unsupported_queries_are_left_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(energy_supported=False))
    with NvmlSampler() as sampler:
        assert sampler.unsupported == ["energy_mj"]
        assert "energy_mj" not in sampler.read() and "power_mw" in sampler.read()


def test_no_driver_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_fails=True))
    with pytest.raises(MissingDependencyError, match="NVML is not usable here: Driver Not Loaded"):
        NvmlSampler().open()
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(MissingDependencyError, match="nvidia-ml-py is not installed"):
        NvmlSampler().open()

"""The NVML sampler against a stand-in pynvml module: NVML needs an NVIDIA driver and GPU, which
this machine lacks. The stand-in follows pynvml's names, units (mW, mJ, bytes) and errors."""

import sys
import time
import types

import pytest

from device.errors import MissingDependencyError
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
    assert trace.peak("gpu_mem_used_mb") == 3072 and trace.peak("gpu_freq_mhz") == 1980
    # Integrated power and the driver's energy counter agree (both 300 W over the window).
    counted = trace.values["energy_mj"][-1] - trace.values["energy_mj"][0]
    assert trace.integral("power_mw") == pytest.approx(counted, rel=0.05)


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


def averaging_pynvml(step_at):
    """An Ampere-like GPU: 100 W, then 300 W from ``step_at``; the reported power is the mean of
    the last second (as nvmlDeviceGetPowerUsage is on Ampere and newer), the counter is exact."""
    module = fake_pynvml()
    module.step_at = step_at

    def energy_mj(t):
        return 100_000 * t + 200_000 * max(0.0, t - module.step_at)

    module.nvmlDeviceGetTotalEnergyConsumption = lambda handle: int(energy_mj(time.monotonic()))
    module.nvmlDeviceGetPowerUsage = lambda handle: int(energy_mj(time.monotonic()) - energy_mj(time.monotonic() - 1))
    module.nvmlDeviceGetCurrentClocksEventReasons = lambda handle: 0x4  # HW slowdown
    module.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: (_ for _ in ()).throw(
        AssertionError("the deprecated call was used"))
    module.exact_mj = energy_mj
    return module


def test_energy_comes_from_the_counter_not_the_averaged_power(monkeypatch):
    from device.telemetry.base import window_energy

    step_at = time.monotonic() + 0.1
    module = averaging_pynvml(step_at)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    with NvmlSampler(rate_hz=50) as sampler:
        sampler.start()
        start = time.monotonic()
        time.sleep(0.5)
        stop = time.monotonic()
        trace = sampler.stop()
    assert sampler.energy_counter_key == "energy_mj" and "1 s average" in sampler.provenance["power"]
    calls = [(start, stop, 1000)]
    result = window_energy(trace, start, stop, calls, power_key="power_mw", counter_key=sampler.energy_counter_key)
    exact = module.exact_mj(stop) - module.exact_mj(start)
    assert result["energy_mj_per_image"] * 1000 == pytest.approx(exact, rel=0.01)
    assert "counter" in result["energy_method"]
    # Integrating the 1 s average instead misses most of the step (the old way).
    smeared = window_energy(trace, start, stop, calls, power_key="power_mw")
    assert smeared["energy_mj_per_image"] * 1000 < 0.8 * exact
    assert trace.values["throttle_reasons"][0] == 0x4
    assert sampler.provenance["throttle_reasons"] == "nvmlDeviceGetCurrentClocksEventReasons"


def test_the_protocol_takes_energy_from_the_counter(monkeypatch, tmp_path):
    """measure() over an NVML sampler: energy per image from the counter, idle from the counter too."""
    import numpy as np

    from device.measure import MeasureSpec, measure

    module = averaging_pynvml(step_at=float("inf"))  # 100 W until the first inference, 300 W from then
    monkeypatch.setitem(sys.modules, "pynvml", module)

    class Sleeper:
        def infer(self, batch):
            module.step_at = min(module.step_at, time.monotonic())
            time.sleep(0.01)

    with NvmlSampler(rate_hz=50) as sampler:
        result = measure(Sleeper(), np.zeros((2, 1), dtype=np.float32),
                         MeasureSpec(warmup_iterations=0, iterations=30, idle_s=0.2), [sampler],
                         power_key="power_mw").model_dump()
    tele = result["telemetry"]["nvml"]
    # 300 W over the window, ~0.01 s per 2-image call: ≈1.5 J per image (not the averaged power's).
    assert tele["energy_mj_per_image"] == pytest.approx(300_000 * result["window_s"] / result["images"], rel=0.03)
    assert tele["series"]["power_mw"]["idle"] == pytest.approx(100_000, rel=0.01)
    assert tele["coverage"] == pytest.approx(1.0) and not tele["degraded"]


def two_gpu_pynvml():
    """A stand-in pynvml on a two-GPU server: each handle reports its own GPU's power, so reading the wrong
    one shows in the numbers. NVML's index follows PCI order; CUDA's may not."""
    module = fake_pynvml()
    gpus = {"00000000:01:00.0": ("gpu", 0), "00000000:41:00.0": ("gpu", 1)}
    module.lookups = []

    def by_bus(bus):
        module.lookups.append(("pci", bus))
        return gpus[bus.upper() if len(bus.split(":")[0]) == 8 else "0000" + bus.upper()]

    def by_index(index):
        module.lookups.append(("index", index))
        return ("gpu", index)

    module.nvmlDeviceGetHandleByPciBusId = by_bus
    module.nvmlDeviceGetHandleByIndex = by_index
    module.nvmlDeviceGetPowerUsage = lambda handle: 100_000 + 200_000 * handle[1]  # GPU 1 draws 300 W
    return module


def test_power_comes_from_the_gpu_the_runner_uses(monkeypatch):
    """Issue 25, point 2: under CUDA_VISIBLE_DEVICES=1 the job runs on the GPU at 41:00.0, not NVML's index 0."""
    import device.telemetry.nvml as nvml_module
    from device.jobrun import open_samplers

    module = two_gpu_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    samplers, notes = open_samplers(["nvml"], 20.0, None, pci_bus_id="00000000:41:00.0")
    try:
        assert samplers[0].read()["power_mw"] == 300_000 and module.lookups == [("pci", "00000000:41:00.0")]
        assert samplers[0].provenance["device"] == "PCI bus id 00000000:41:00.0"
    finally:
        samplers[0].close()
    # No bus id from the runner and none from the CUDA runtime: an index under CUDA_VISIBLE_DEVICES is not
    # guessed (NVML's index 1 need not be CUDA's device 1); the fix says how to name the GPU.
    monkeypatch.setattr(nvml_module, "cuda_pci_bus_id", lambda: None)
    with pytest.raises(MissingDependencyError, match="cannot tell which GPU") as err:
        NvmlSampler().open()
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in err.value.fix
    monkeypatch.setattr(nvml_module, "cuda_pci_bus_id", lambda: "0000:41:00.0")  # cudaDeviceGetPCIBusId's form
    with NvmlSampler() as sampler:
        assert sampler.read()["power_mw"] == 300_000


def test_tensorrt_job_samples_the_runner_gpu(monkeypatch, tmp_path):
    """The whole chain: the TensorRT runner's cudaDeviceGetPCIBusId → the job → the NVML sampler
    (TensorRT, CUDA and NVML are stand-ins here: tests/device/trt_standin.py, two_gpu_pynvml)."""
    from device.files import sha256_file
    from device.jobrun import run_job
    from tests.device import trt_standin
    from tests.device.agent_process import tiny_onnx

    trt_standin.install(monkeypatch, "10.3.0")
    monkeypatch.setattr(trt_standin.FakeCuda, "bus_id", "0000:41:00.0")
    module = two_gpu_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    model = tiny_onnx(tmp_path / "m.onnx")
    job = {"spec": {"artifact": sha256_file(model), "runtime": "tensorrt", "precision": "fp32", "batch_sizes": [1],
                    "iterations": 5, "warmup_iterations": 1, "idle_s": 0.0, "telemetry": ["nvml"], "profile": False},
           "artifact_path": str(model), "engine_cache": str(tmp_path / "engines")}
    result = run_job(job, tmp_path)
    series = result["runs"][0]["telemetry"]["nvml"]["series"]["power_mw"]
    assert series["peak"] == 300_000 and ("index", 0) not in module.lookups  # GPU 0 would read 100 W

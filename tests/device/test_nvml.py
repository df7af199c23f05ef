"""The NVML sampler against a stand-in pynvml module: NVML needs an NVIDIA driver and GPU, which
this machine lacks. The stand-in follows pynvml's names, units (mW, mJ, bytes) and errors."""

import sys
import time
import types

import pytest

from device.errors import MissingDependencyError
from device.telemetry.nvml import NvmlSampler


class FakeNVMLError(Exception):
    def __init__(self, message: str = "", value: int | None = None):
        super().__init__(message)
        self.value = value  # pynvml's NVMLError carries the nvmlReturn_t code as .value


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

    from device.jobs.measure import MeasureSpec, measure

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
    """Under CUDA_VISIBLE_DEVICES=1 the job runs on the GPU at 41:00.0, not NVML's index 0."""
    import device.telemetry.nvml as nvml_module
    from device.jobs.jobrun import open_samplers

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
    from device.jobs.jobrun import run_job
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


# ------------------------------------------------------------------ the data-center sweep
def controllable_pynvml(root: bool = True):
    """The two-GPU stand-in (not NVML) with the device commands a sweep uses, per GPU: a power limit in mW within
    [100, 350] W (300 W by default), and a locked graphics clock. A GPU draws min(300 W, its limit), scaled by a
    locked clock against 1980 MHz, so a window shows which setting it ran under. Without ``root`` every command
    answers NVML_ERROR_NO_PERMISSION (NVML's device commands "require root/admin access")."""
    module = two_gpu_pynvml()
    module.NVML_ERROR_NO_PERMISSION, module.NVML_ERROR_INVALID_ARGUMENT = 4, 2
    buses = {0: "00000000:01:00.0", 1: "00000000:41:00.0"}
    module.limits_mw = {0: 300_000, 1: 300_000}
    module.locked = {0: None, 1: None}
    module.commands = []
    graphics = list(range(210, 1981, 15))

    def command(name, handle, apply):
        module.commands.append((name, handle[1]))
        if not root:
            raise FakeNVMLError("Insufficient Permissions", value=module.NVML_ERROR_NO_PERMISSION)
        apply()

    def set_limit(handle, mw):
        if not 100_000 <= mw <= 350_000:
            raise FakeNVMLError("Invalid Argument", value=module.NVML_ERROR_INVALID_ARGUMENT)
        command("set_limit", handle, lambda: module.limits_mw.__setitem__(handle[1], mw))

    def lock(handle, low, high):
        if low != high or low not in graphics:
            raise FakeNVMLError("Invalid Argument", value=module.NVML_ERROR_INVALID_ARGUMENT)
        command("lock", handle, lambda: module.locked.__setitem__(handle[1], low))

    def draw(handle):
        watts = min(300_000, module.limits_mw[handle[1]]) if handle[1] == 1 else 100_000
        return int(watts * (module.locked[handle[1]] / 1980 if module.locked[handle[1]] else 1))

    module.nvmlDeviceGetUUID = lambda handle: f"GPU-standin-{handle[1]}"
    module.nvmlDeviceGetHandleByUUID = lambda uuid: ("gpu", int(uuid.rsplit("-", 1)[1]))
    module.nvmlDeviceGetPciInfo = lambda handle: types.SimpleNamespace(busId=buses[handle[1]].encode())
    module.nvmlDeviceGetPowerManagementLimit = lambda handle: module.limits_mw[handle[1]]
    module.nvmlDeviceGetPowerManagementLimitConstraints = lambda handle: [100_000, 350_000]
    module.nvmlDeviceGetSupportedMemoryClocks = lambda handle: [2619, 1593]
    module.nvmlDeviceGetSupportedGraphicsClocks = lambda handle, memory: list(reversed(graphics))
    module.nvmlDeviceSetPowerManagementLimit = set_limit
    module.nvmlDeviceSetGpuLockedClocks = lock
    module.nvmlDeviceResetGpuLockedClocks = lambda handle: command(
        "reset", handle, lambda: module.locked.__setitem__(handle[1], None))
    module.nvmlDeviceGetPowerUsage = draw
    return module


def _gpu_sweep_job(tmp_path, monkeypatch, sweep, root=True):
    from device.files import sha256_file
    from tests.device import trt_standin
    from tests.device.agent_process import tiny_onnx

    trt_standin.install(monkeypatch, "10.3.0")
    monkeypatch.setattr(trt_standin.FakeCuda, "bus_id", "0000:41:00.0")  # the runner's GPU is NVML's index 1
    module = controllable_pynvml(root=root)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    model = tiny_onnx(tmp_path / "m.onnx")
    job = {"spec": {"artifact": sha256_file(model), "runtime": "tensorrt", "precision": "fp32", "batch_sizes": [1],
                    "iterations": 5, "warmup_iterations": 1, "idle_s": 0.0, "telemetry": ["nvml"], "profile": False,
                    "sweep": sweep},
           "artifact_path": str(model), "engine_cache": str(tmp_path / "engines"),
           "hold_path": str(tmp_path / "hold.json"), "job_id": "gpu-sweep"}
    return job, module


def test_gpu_sweep_measures_each_power_limit_on_the_runners_gpu_and_restores_it(monkeypatch, tmp_path):
    from device.jobs.jobrun import run_job
    from device.schema import JobResult

    job, module = _gpu_sweep_job(tmp_path, monkeypatch, {"power_limits_w": [150, 250]})
    module.limits_mw[1] = 280_000  # as found: not the default, so the restore must remember it
    result = JobResult.model_validate(run_job(job, tmp_path))
    assert [run.power_setting.power_limit_w for run in result.runs] == [150, 250]
    assert [run.telemetry["nvml"].series["power_mw"].peak for run in result.runs] == [150_000, 250_000]
    assert [w["mode"] for w in result.sweep_windows()] == ["150 W limit", "250 W limit"]
    assert {gpu for _, gpu in module.commands} == {1} and ("index", 0) not in module.lookups, "GPU 0 never touched"
    assert module.limits_mw == {0: 300_000, 1: 280_000} and module.locked == {0: None, 1: None}
    sweep = result.sweep
    assert sweep.controlled and sweep.restored and sweep.original == {
        "pci_bus_id": "00000000:41:00.0", "uuid": "GPU-standin-1", "power_limit_mw": 280_000}
    assert not (tmp_path / "hold.json").exists()


def test_gpu_sweep_locks_clocks_then_unlocks_and_refuses_what_the_gpu_lacks(monkeypatch, tmp_path):
    from device.errors import ConfigError
    from device.jobs.jobrun import run_job
    from device.schema import JobResult

    job, module = _gpu_sweep_job(tmp_path, monkeypatch, {"gpu_clocks_mhz": [1410, 990]})
    result = JobResult.model_validate(run_job(job, tmp_path))
    assert [run.power_setting.gpu_locked_mhz for run in result.runs] == [1410, 990]
    assert [c for c in module.commands if c[0] in ("lock", "reset")] == [("lock", 1), ("lock", 1), ("reset", 1)]
    assert module.locked[1] is None and result.sweep.restored
    job["spec"]["sweep"] = {"gpu_clocks_mhz": [2500]}
    module.commands.clear()
    with pytest.raises(ConfigError, match=r"2500\] is outside this GPU's graphics clocks \[210, 1980\] MHz"):
        run_job(job, tmp_path)
    job["spec"]["sweep"] = {"power_limits_w": [90]}
    with pytest.raises(ConfigError, match=r"outside this GPU's limits \[100, 350\] W"):
        run_job(job, tmp_path)
    assert module.commands == [] and not (tmp_path / "hold.json").exists(), "refused before any change"


def test_without_permission_the_gpu_sweep_measures_the_current_setting_and_says_so(monkeypatch, tmp_path):
    from device.jobs.jobrun import run_job
    from device.schema import JobResult

    job, module = _gpu_sweep_job(tmp_path, monkeypatch, {"power_limits_w": [150, 250]}, root=False)
    result = JobResult.model_validate(run_job(job, tmp_path))
    assert result.sweep.controlled is False and "no permission" in result.sweep.note
    assert "measured the current setting only" in result.sweep.note
    assert len(result.runs) == 1 and result.runs[0].power_setting is None
    assert module.limits_mw[1] == 300_000 and not (tmp_path / "hold.json").exists()


def test_a_gpu_hold_left_by_a_killed_sweep_is_restored_by_the_agents_restore(monkeypatch, tmp_path):
    """After kill -9 (or a cancel, which kills the job process) the agent runs ``python -m device.power.power_modes
    restore --hold``: the same hold file, here holding a GPU's limit, restored through NVML by UUID."""
    from device.power.gpu_power import GpuState, write_gpu_hold
    from device.service.hold import main
    from device.power.power_modes import read_hold

    module = controllable_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    hold = tmp_path / "power_mode_hold.json"
    original = GpuState("00000000:41:00.0", "GPU-standin-1", 280_000)
    write_gpu_hold(hold, "killed-job", original)
    module.limits_mw[1], module.locked[1] = 150_000, 990  # where the killed sweep left GPU 1
    assert read_hold(hold) == ("killed-job", original)
    assert "sudo nvidia-smi -i 00000000:41:00.0 -pl 280" in original.by_hand()
    assert main(["restore", "--hold", str(hold)]) == 0
    assert module.limits_mw == {0: 300_000, 1: 280_000} and module.locked[1] is None and not hold.exists()
    write_gpu_hold(hold, "killed-job", original)
    module.limits_mw[1] = 150_000
    monkeypatch.setitem(sys.modules, "pynvml", controllable_pynvml(root=False))
    assert main(["restore", "--hold", str(hold)]) == 3 and hold.exists(), "a failed restore keeps the hold"


def test_gpu_sweep_spec_varies_one_knob():
    from pydantic import ValidationError

    from device.schema import JobSpec

    base = {"artifact": "a" * 64}
    assert JobSpec.model_validate({**base, "sweep": {"power_limits_w": [150.0, 250]}}).sweep.power_modes is None
    for bad in ({"power_limits_w": [150], "gpu_clocks_mhz": [990]}, {"power_limits_w": [150], "power_modes": "all"},
                {"power_limits_w": [150, 150]}, {"power_limits_w": [0]}, {"gpu_clocks_mhz": [990.5]},
                {"gpu_clocks_mhz": [990], "jetson_clocks": [True]}, {}):
        with pytest.raises(ValidationError):
            JobSpec.model_validate({**base, "sweep": bad})

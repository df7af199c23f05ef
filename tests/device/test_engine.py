"""Engine builder logic that is plain Python, tested without TensorRT; the real build runs
under ``-m tensorrt`` where TensorRT exists (a Jetson or a GPU server) and is skipped here."""

import importlib.util
import json

import pytest

from device.runners.engine import (
    BuildOptions, EngineCache, artifact_precision, build_engine, build_settings, fingerprint, import_tensorrt,
    read_l4t, reconcile_precision, trtexec_command, trtexec_lines, detect_gpu,
)
from device.errors import ConfigError, DlaError, MissingDependencyError, PrecisionMismatchError

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def test_tensorrt_10_int8_uses_q_dq_with_fp16_fallback():
    settings = build_settings("10.3.0", BuildOptions(precision="int8"))
    assert settings.network_flags == () and settings.builder_flags == ("INT8", "FP16")


def test_tensorrt_11_is_strongly_typed_without_precision_flags():
    settings = build_settings("11.4.1", BuildOptions(precision="int8"))
    assert settings.network_flags == ("STRONGLY_TYPED",) and settings.builder_flags == ()
    with pytest.raises(ConfigError, match="no FP16 builder flag") as err:
        build_settings("11.0.0", BuildOptions(precision="fp16"))
    assert "modelopt.onnx.autocast" in err.value.fix


def test_dla_adds_gpu_fallback_and_old_tensorrt_is_refused():
    # trtexec (sampleEngines.cpp) sets PREFER_PRECISION_CONSTRAINTS on every DLA build; 11 has no such flag.
    assert build_settings("10.3.0", BuildOptions(dla_core=0)).builder_flags[-2:] == ("GPU_FALLBACK",
                                                                               "PREFER_PRECISION_CONSTRAINTS")
    assert build_settings("11.4.1", BuildOptions(dla_core=0), board="NVIDIA Jetson AGX Orin").builder_flags == (
        "GPU_FALLBACK",)
    with pytest.raises(ConfigError, match="too old"):
        build_settings("8.6.1", BuildOptions())
    with pytest.raises(ConfigError, match="cannot read the TensorRT version"):
        build_settings("", BuildOptions())


@pytest.mark.parametrize("kw, message", [
    (dict(precision="int4"), "precision must be"),
    (dict(batch=(4, 2, 8)), "1 ≤ min ≤ opt ≤ max"),
    (dict(workspace_mib=0), "workspace_mib"),
    (dict(dla_core=-1), "dla_core"),
])
def test_bad_options(kw, message):
    with pytest.raises(ConfigError, match=message):
        BuildOptions(**kw)


def test_trtexec_lines_for_both_generations():
    options = BuildOptions(batch=(8, 8, 8), workspace_mib=512, dla_core=1, timing_cache="cache.bin")
    ten = trtexec_command("m.onnx", "m.plan", "input", (3, 32, 32), options, "10.3.0")
    assert ten == ["trtexec", "--onnx=m.onnx", "--saveEngine=m.plan", "--minShapes=input:8x3x32x32",
                   "--optShapes=input:8x3x32x32", "--maxShapes=input:8x3x32x32", "--memPoolSize=workspace:512M",
                   "--int8", "--fp16", "--useDLACore=1", "--allowGPUFallback", "--precisionConstraints=prefer",
                   "--profilingVerbosity=detailed",
                   "--timingCacheFile=cache.bin"]
    eleven = trtexec_command("m.onnx", "m.plan", "input", (3, 32, 32), BuildOptions(), "11.4.1")
    assert not any(flag in eleven for flag in ("--int8", "--fp16", "--stronglyTyped"))
    static = trtexec_command("m.onnx", "m.plan", "input", (3, 32, 32), options, "10.3.0", static_batch=True)
    assert static == [flag for flag in ten if "Shapes=" not in flag]


def test_each_measured_batch_is_built_with_opt_equal_to_that_batch():
    """Point 2: kernels are tuned for the shape timed; the trtexec line is that build's."""
    options = BuildOptions(precision="int8")
    assert options.for_batch(1).batch == (1, 1, 1) and options.for_batch(32).batch == (32, 32, 32)
    lines = trtexec_lines("student.int8.onnx", "student.int8", "input", (3, 16, 16), [1, 32], "int8", "10.3")
    first, second = lines.splitlines()
    assert "--optShapes=input:1x3x16x16" in first and "--maxShapes=input:1x3x16x16" in first
    assert "--saveEngine=student.int8.b1.plan" in first and "--optShapes=input:32x3x16x16" in second
    assert "--int8 --fp16" in first


def test_dla_needs_static_shapes_and_gets_the_fp16_artifact_never_fp32_built_as_fp16():
    """DLA takes no dynamic dimension, and runs FP16/INT8 only: an FP32 artifact is refused (built
    "as FP16" it would be timed in one precision and scored in another); the FP16 artifact builds with FP16."""
    with pytest.raises(DlaError, match="static shapes"):
        build_settings("10.3.0", BuildOptions(precision="fp16", batch=(1, 32, 32), dla_core=0))
    with pytest.raises(DlaError, match="FP32 artifact cannot run on the DLA") as err:
        build_settings("10.3.0", BuildOptions(precision="fp32", batch=(8, 8, 8), dla_core=0))
    assert "student_fp16" in err.value.fix
    settings = build_settings("10.3.0", BuildOptions(precision="fp16", batch=(8, 8, 8), dla_core=0), artifact="fp16")
    assert settings.builder_flags == ("FP16", "GPU_FALLBACK", "PREFER_PRECISION_CONSTRAINTS")
    assert build_settings("10.3.0", BuildOptions(precision="fp32")).builder_flags == ()  # the GPU keeps FP32


@pytest.mark.parametrize("version, board, precision, message", [
    ("11.0.0", None, "int8", "11.0–11.3"),
    ("11.3.2", "NVIDIA Jetson AGX Orin Developer Kit", "int8", "11.0–11.3"),
    ("11.4.1", "NVIDIA Jetson AGX Thor Developer Kit", "int8", "only on Jetson AGX Orin"),
    ("11.4.1", "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super", "int8", "only on Jetson AGX Orin"),
    ("11.4.1", "NVIDIA Jetson AGX Orin Developer Kit", "fp32", "FP32 artifact cannot run on the DLA"),
])
def test_tensorrt_11_dla_rules(version, board, precision, message):
    """Point 4: DLA is gone in 11.0–11.3, AGX Orin only from 11.4.1, and strongly typed (no FP32)."""
    with pytest.raises(DlaError, match=message):
        build_settings(version, BuildOptions(precision=precision, dla_core=0), board=board)
    settings = build_settings("11.4.1", BuildOptions(precision="int8", dla_core=0), board="NVIDIA Jetson AGX Orin Developer Kit")
    assert settings.network_flags == ("STRONGLY_TYPED",) and settings.builder_flags == ("GPU_FALLBACK",)


def test_requested_precision_must_agree_with_the_artifact(tmp_path):
    """Point 4: a Q/DQ model is INT8 (per the Q/DQ lint), a float model runs in its own type."""
    from tests.device.agent_process import tiny_onnx
    from tests.device.trt_standin import qdq_classifier

    qdq, float_model = qdq_classifier(tmp_path / "q.onnx"), tiny_onnx(tmp_path / "f.onnx")
    assert artifact_precision(qdq) == "int8" and artifact_precision(float_model) == "fp32"
    assert reconcile_precision("int8", "int8", "11.1.0") == "int8"
    with pytest.raises(PrecisionMismatchError, match="no Q/DQ nodes"):
        reconcile_precision("int8", "fp32", "10.3.0")
    with pytest.raises(PrecisionMismatchError, match="Q/DQ nodes"):
        reconcile_precision("fp16", "int8", "11.1.0")
    # The label must name the artifact on 10.x too (no more FP32 built "as FP16").
    for version in ("10.3.0", "10.16.0", "11.1.0"):
        with pytest.raises(PrecisionMismatchError, match="weights are FP32") as err:
            reconcile_precision("fp16", "fp32", version)
        assert "student_fp16" in err.value.fix
    assert build_settings("11.1.0", BuildOptions(precision="fp16"), artifact="fp16").builder_flags == ()


def test_an_fp16_artifact_with_float32_io_is_fp16(tmp_path):
    """The precision is read from the compute layers' weights, not the input type (FP16 keeps float32 I/O)."""
    import onnx
    from onnxconverter_common import float16

    from tests.device.agent_process import tiny_onnx

    model = onnx.load(str(tiny_onnx(tmp_path / "f.onnx")))
    onnx.save(float16.convert_float_to_float16(model, keep_io_types=True), str(tmp_path / "h.onnx"))
    assert onnx.load(str(tmp_path / "h.onnx")).graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert artifact_precision(tmp_path / "h.onnx") == "fp16"
    # 10.12+ builds it strongly typed, as the INT8 rung: the graph's types, no deprecated flag.
    settings = build_settings("10.12.0", BuildOptions(precision="fp16"), artifact="fp16")
    assert settings.network_flags == ("STRONGLY_TYPED",) and settings.builder_flags == ()
    assert build_settings("10.3.0", BuildOptions(precision="fp16"), artifact="fp16").builder_flags == ("FP16",)


def test_from_10_12_int8_is_strongly_typed_without_deprecated_flags():
    """Point 6: BuilderFlag.INT8/FP16 are deprecated from 10.12; the Q/DQ model types the network."""
    settings = build_settings("10.12.0", BuildOptions(precision="int8"))
    assert settings.network_flags == ("STRONGLY_TYPED",) and settings.builder_flags == ()
    line = trtexec_command("m.onnx", "m.plan", "input", (3, 8, 8), BuildOptions(precision="int8"), "10.16.0")
    assert "--stronglyTyped" in line and "--int8" not in line
    # TensorRT 10.8–10.16 have no DLA at all (10.7 was the last 10.x with it), so no DLA build is strongly typed
    # on 10.x: a 10.7 DLA build keeps the INT8/FP16 flags the float layers around the Q/DQ pairs need.
    with pytest.raises(DlaError, match="10.7 as the last"):
        build_settings("10.16.0", BuildOptions(precision="int8", dla_core=0))
    dla = build_settings("10.7.0", BuildOptions(precision="int8", dla_core=0))
    assert dla.network_flags == () and dla.builder_flags[:3] == ("INT8", "FP16", "GPU_FALLBACK")


class _FakeNvml:
    """pynvml as seen by detect_gpu: records which lookup it was asked for."""

    def __init__(self):
        self.calls = []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        self.calls.append(("index", index))
        return f"gpu{index}"

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        self.calls.append(("pci", bus))
        return "gpu-by-bus"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(("uuid", uuid))
        return "gpu-by-uuid"

    def nvmlDeviceGetName(self, handle):
        return {"gpu0": "A100", "gpu-by-bus": "H100", "gpu-by-uuid": "L4", "gpu1": "T4"}[handle]

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return (9, 0)


def test_nvml_describes_the_gpu_cuda_uses(monkeypatch, tmp_path):
    """Point 6: NVML index 0 may not be CUDA device 0 under CUDA_VISIBLE_DEVICES."""
    nvml = _FakeNvml()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert detect_gpu(str(tmp_path / "none"), pci_bus_id="0000:02:00.0") == ("H100", "9.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5a6b")
    assert detect_gpu(str(tmp_path / "none")) == ("L4", "9.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # CUDA's order may not be NVML's: no guess
    assert detect_gpu(str(tmp_path / "none")) == ("unknown", None)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert detect_gpu(str(tmp_path / "none")) == ("T4", "9.0")
    assert nvml.calls == [("pci", "0000:02:00.0"), ("uuid", "GPU-5a6b"), ("index", 1)]


def test_thor_is_in_the_compute_capability_table(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)
    compatible = tmp_path / "compatible"
    compatible.write_bytes(b"nvidia,p3834-0008\0nvidia,tegra264\0")
    assert detect_gpu(str(compatible)) == ("tegra264 iGPU", "11.0")


def test_libcudart_is_found_where_pip_puts_it(tmp_path):
    """Point 5: pip's TensorRT brings libcudart.so.12/.13 under site-packages/nvidia/…, no plain .so."""
    from device.runners.cuda import cudart_candidates

    for lib in ("nvidia/cuda_runtime/lib/libcudart.so.12", "nvidia/cu13/lib/libcudart.so.13"):
        (tmp_path / lib).parent.mkdir(parents=True)
        (tmp_path / lib).write_bytes(b"")
    loaded = "7f00-7f10 r-xp 00000000 08:01 42 /opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12\n"
    found = cudart_candidates(site_dirs=[str(tmp_path)], maps=loaded)
    assert found[0] == "/opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12"  # the copy TensorRT already loaded
    assert str(tmp_path / "nvidia/cuda_runtime/lib/libcudart.so.12") in found
    assert str(tmp_path / "nvidia/cu13/lib/libcudart.so.13") in found
    assert found.index("libcudart.so.12") < found.index("libcudart.so")


def test_l4t_is_read_from_nv_tegra_release(tmp_path):
    """The L4T → JetPack table is tested in test_jetson_facts.py; here, where the L4T release comes from."""
    release = tmp_path / "nv_tegra_release"
    release.write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n")
    assert read_l4t(str(release)) == "36.4.3"
    assert read_l4t(str(tmp_path / "absent")) is None


def test_jetson_gpu_from_the_device_tree(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # as on Tegra: no usable NVML
    compatible = tmp_path / "compatible"
    compatible.write_bytes(b"nvidia,p3768-0000+p3767-0005\0nvidia,tegra234\0")
    assert detect_gpu(str(compatible)) == ("tegra234 iGPU", "8.7")
    compatible.write_bytes(b"acme,board\0")
    assert detect_gpu(str(compatible)) == ("unknown", None)


def test_engine_is_rebuilt_when_the_fingerprint_differs(tmp_path):
    """A stand-in builder (TensorRT cannot run here) counts builds; the cache logic is real."""
    builds = []

    def fake_build(onnx, options, engine_path):
        builds.append(onnx)
        engine_path.write_bytes(b"plan for " + onnx.name.encode())

    cache = EngineCache(tmp_path / "engines")
    orin = fingerprint("10.3.0", "tegra234 iGPU", "8.7", "36.4.3")
    options = BuildOptions()
    engine, built = cache.get_or_build("m.onnx", "ab" * 32, orin, options, fake_build)
    assert built and engine.read_bytes() == b"plan for m.onnx"
    assert json.loads((engine.parent / "fingerprint.json").read_text())["jetpack"] == "6.2"
    assert cache.get_or_build("m.onnx", "ab" * 32, orin, options, fake_build) == (engine, False)
    upgraded = fingerprint("10.7.0", "tegra234 iGPU", "8.7", "36.4.4")
    _, built = cache.get_or_build("m.onnx", "ab" * 32, upgraded, options, fake_build)
    assert built and len(builds) == 2
    # A tampered fingerprint file is never trusted.
    (engine.parent / "fingerprint.json").write_text(json.dumps({**orin, "tensorrt": "9.0"}))
    assert cache.lookup("ab" * 32, orin, options) is None


@pytest.mark.skipif(HAS_TENSORRT, reason="TensorRT is installed here")
def test_missing_tensorrt_says_how_to_get_it(tmp_path):
    with pytest.raises(MissingDependencyError, match="TensorRT is not installed") as err:
        import_tensorrt()
    assert "JetPack" in err.value.fix
    with pytest.raises(MissingDependencyError):
        build_engine(tmp_path / "m.onnx", BuildOptions(), tmp_path / "m.plan")


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TENSORRT, reason="needs TensorRT and a GPU (a Jetson or a GPU server); absent here")
def test_build_a_real_engine_from_a_q_dq_model(tiny_run, tmp_path):
    int8 = tiny_run.run_dir / tiny_run.manifest.stage("quantize")["outputs"]["student_int8"]
    options = BuildOptions(batch=(1, 4, 8), timing_cache=str(tmp_path / "cache.bin"))
    build_engine(int8, options, tmp_path / "student.plan")
    assert (tmp_path / "student.plan").stat().st_size > 0 and (tmp_path / "cache.bin").stat().st_size > 0

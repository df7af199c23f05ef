"""Engine builder logic that is plain Python, tested without TensorRT; the real build runs
under ``-m tensorrt`` where TensorRT exists (a Jetson or a GPU server) and is skipped here."""

import importlib.util
import json

import pytest

from device.engine import (
    BuildOptions, EngineCache, build_engine, fingerprint, import_tensorrt, jetpack_for, plan_build, read_l4t,
    trtexec_command, detect_gpu,
)
from device.errors import ConfigError, MissingDependencyError

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def test_tensorrt_10_int8_uses_q_dq_with_fp16_fallback():
    plan = plan_build("10.3.0", BuildOptions(precision="int8"))
    assert plan.network_flags == () and plan.builder_flags == ("INT8", "FP16")


def test_tensorrt_11_is_strongly_typed_without_precision_flags():
    plan = plan_build("11.4.1", BuildOptions(precision="int8"))
    assert plan.network_flags == ("STRONGLY_TYPED",) and plan.builder_flags == ()
    with pytest.raises(ConfigError, match="no FP16 builder flag") as err:
        plan_build("11.0.0", BuildOptions(precision="fp16"))
    assert "modelopt.onnx.autocast" in err.value.fix


def test_dla_adds_gpu_fallback_and_old_tensorrt_is_refused():
    assert plan_build("10.3.0", BuildOptions(dla_core=0)).builder_flags[-1] == "GPU_FALLBACK"
    with pytest.raises(ConfigError, match="too old"):
        plan_build("8.6.1", BuildOptions())
    with pytest.raises(ConfigError, match="cannot read the TensorRT version"):
        plan_build("", BuildOptions())


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
    options = BuildOptions(batch=(1, 8, 32), workspace_mib=512, dla_core=1, timing_cache="cache.bin")
    ten = trtexec_command("m.onnx", "m.plan", "input", (3, 32, 32), options, "10.3.0")
    assert ten == ["trtexec", "--onnx=m.onnx", "--saveEngine=m.plan", "--minShapes=input:1x3x32x32",
                   "--optShapes=input:8x3x32x32", "--maxShapes=input:32x3x32x32", "--memPoolSize=workspace:512M",
                   "--int8", "--fp16", "--useDLACore=1", "--allowGPUFallback", "--timingCacheFile=cache.bin"]
    eleven = trtexec_command("m.onnx", "m.plan", "input", (3, 32, 32), BuildOptions(), "11.4.1")
    assert not any(flag in eleven for flag in ("--int8", "--fp16", "--stronglyTyped"))


def test_l4t_and_jetpack(tmp_path):
    release = tmp_path / "nv_tegra_release"
    release.write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n")
    assert read_l4t(str(release)) == "36.4.3" and jetpack_for("36.4.3") == "6.2"
    assert jetpack_for("36.3.0") == "6.0" and jetpack_for("35.5.0") == "5.1.3" and jetpack_for("99.1") is None
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

"""The TensorRT runner end to end against the stand-in (tests/device/trt_standin.py), which encodes the
documented behaviour it relies on: profile bounds, the bool returns, DLA's static-shape, precision and
core rules, strongly typed networks on 11. Real TensorRT runs the ``tensorrt``/``gpu`` tests elsewhere."""

import json

import numpy as np
import onnx
import pytest

from device.errors import (DlaError, PrecisionMismatchError, ShapeOutsideProfileError, StaticShapeError,
                           TensorRTCallError, TimingCacheError)
from device.jobs.jobrun import smoke
from device.jobs.profile import Profile, profile_runner
from device.runners import make_runner
from tests.device import trt_standin
from tests.device.agent_process import tiny_onnx

AGX_ORIN = "NVIDIA Jetson AGX Orin Developer Kit"


@pytest.fixture
def float_model(tmp_path):
    return tiny_onnx(tmp_path / "float.onnx")


@pytest.fixture
def half_model(tmp_path):
    """The float model's FP16 form, as the export stage writes it: FP16 weights and compute, float32 I/O."""
    from onnxconverter_common import float16

    path = tmp_path / "half.onnx"
    onnx.save(float16.convert_float_to_float16(onnx.load(str(tiny_onnx(tmp_path / "f32.onnx"))), keep_io_types=True),
              str(path))
    return path


@pytest.fixture
def qdq_model(tmp_path):
    return trt_standin.qdq_classifier(tmp_path / "int8.onnx")


def runner(path, tmp_path, **kw):
    kw.setdefault("precision", "fp32")
    return make_runner("tensorrt", str(path), engine_cache=str(tmp_path / "engines"), **kw)


# ------------------------------------------------------------------ point 1: profile bounds and bools
def test_smoke_and_measured_batches_stay_inside_the_engines(monkeypatch, tmp_path, float_model):
    """batch_sizes [8, 32]: the smoke inference runs at 8 (the photograph repeated), never at 1."""
    trt_standin.install(monkeypatch, "10.3.0")
    with runner(float_model, tmp_path, batch_sizes=(8, 32)) as trt_runner:
        result = smoke(trt_runner, (3, 16, 16), None)
        assert result["output_shape"] == [8, 10] and 0 <= result["top1_index"] < 10
        assert trt_runner.infer(np.zeros((32, 3, 16, 16), np.float32)).shape == (32, 10)
        with pytest.raises(ShapeOutsideProfileError, match=r"batch 1 is outside the engines built for batch "
                                                           r"sizes \[8, 32\]"):
            trt_runner.infer(np.zeros((1, 3, 16, 16), np.float32))


def test_outputs_match_onnxruntime(monkeypatch, tmp_path, float_model):
    trt_standin.install(monkeypatch, "10.3.0")
    batch = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    with make_runner("onnxruntime", str(float_model)) as reference:
        expected = reference.infer(batch)
    with runner(float_model, tmp_path, batch_sizes=(4,)) as trt_runner:
        np.testing.assert_allclose(trt_runner.infer(batch), expected, atol=1e-5)


def test_every_bool_tensorrt_returns_is_checked(monkeypatch, tmp_path, float_model):
    trt = trt_standin.install(monkeypatch, "10.3.0")
    good = np.zeros((8, 3, 16, 16), np.float32)
    with runner(float_model, tmp_path, batch_sizes=(8,)) as trt_runner:
        with pytest.raises(ShapeOutsideProfileError, match=r"\(8, 3, 8, 8\) is not the engine's \(8, 3, 16, 16\)"):
            trt_runner.infer(np.zeros((8, 3, 8, 8), np.float32))  # C×H×W the network does not take
        context = trt_runner._engines[8].context
        monkeypatch.setattr(context, "execute_async_v3", lambda stream: False)
        with pytest.raises(TensorRTCallError, match="execute_async_v3 returned False"):
            trt_runner.infer(good)
    # The shape is set and the addresses bound once, when the engine is loaded: a False there fails the load.
    context_class = type(trt.Runtime(None).deserialize_cuda_engine(
        next((tmp_path / "engines").rglob("engine.plan")).read_bytes()).create_execution_context())
    monkeypatch.setattr(context_class, "set_tensor_address", lambda self, name, pointer: False)
    with pytest.raises(TensorRTCallError, match="set_tensor_address"):
        runner(float_model, tmp_path, batch_sizes=(8,)).load()
    monkeypatch.setattr(context_class, "set_input_shape", lambda self, name, shape: False)
    with pytest.raises(ShapeOutsideProfileError, match="set_input_shape returned False"):
        runner(float_model, tmp_path, batch_sizes=(8,)).load()
    from device.runners.engine import BuildOptions, build_engine

    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"STANDIN-CACHE:another-gpu:10.3.0")
    with pytest.raises(TimingCacheError, match="refused the timing cache") as err:
        build_engine(float_model, BuildOptions(precision="fp32", timing_cache=str(cache)), tmp_path / "e.plan")
    assert str(cache) in err.value.fix
    assert trt.log == []  # refused before any build was attempted


# ------------------------------------------------------------------ point 2: build what is measured
def test_one_engine_per_measured_batch_with_its_trtexec_line(monkeypatch, tmp_path, half_model):
    trt_standin.install(monkeypatch, "10.3.0")
    with runner(half_model, tmp_path, batch_sizes=(1, 8), precision="fp16") as trt_runner:
        plans = {b: json.loads(e.path.read_bytes()) for b, e in trt_runner._engines.items()}
        assert {b: (p["min"][0], p["max"][0]) for b, p in plans.items()} == {1: (1, 1), 8: (8, 8)}
        assert "--optShapes=input:1x3x16x16" in trt_runner.trtexec[1]
        assert "--maxShapes=input:1x3x16x16" in trt_runner.trtexec[1]
        assert "--optShapes=input:8x3x16x16" in trt_runner.trtexec[8]
        assert "--fp16" in trt_runner.trtexec[8] and "--profilingVerbosity=detailed" in trt_runner.trtexec[8]
        trt = __import__("sys").modules["tensorrt"]  # the timed context emits NVTX layer names only
        assert trt_runner._engines[8].context.nvtx_verbosity == trt.ProfilingVerbosity.LAYER_NAMES_ONLY
        assert trt_runner.built_now
    with runner(half_model, tmp_path, batch_sizes=(1, 8), precision="fp16") as trt_runner:
        assert not trt_runner.built_now, "both engines come from the cache the second time"


# ------------------------------------------------------------------ point 3: DLA
def test_dla_fp16_network_runs_on_the_dla_with_fallbacks_named(monkeypatch, tmp_path, half_model, float_model):
    """The DLA gets the FP16 artifact (an FP32 one is refused), static shapes, runtime.DLA_core set
    before deserializing; the layers the DLA cannot run are named, not hidden behind a result that says DLA."""
    trt_standin.install(monkeypatch, "10.3.0", dla_cores=2, board=AGX_ORIN)
    with pytest.raises(DlaError, match="FP32 artifact cannot run on the DLA"):
        runner(float_model, tmp_path, batch_sizes=(1,), precision="fp32", dla_core=1).load()
    with runner(half_model, tmp_path, batch_sizes=(1, 8), precision="fp16", dla_core=1) as trt_runner:
        assert trt_runner.device.startswith("dla:1 + GPU fallback")
        # Flatten is a Shuffle the parser makes (never refused for the DLA's sake); the Gemm and the casts of the
        # float32 I/O really fall back.
        refused = trt_runner.dla_unsupported_layers
        assert any(name.startswith("Gemm") for name in refused) and any("cast" in name for name in refused)
        assert not any(name.startswith("Flatten") for name in refused)
        assert "--useDLACore=1" in trt_runner.trtexec[8] and "--fp16" in trt_runner.trtexec[8]
        assert "--precisionConstraints=prefer" in trt_runner.trtexec[8]  # as trtexec sets for DLA
        profile, note = profile_runner(trt_runner, [1, 8], (3, 16, 16), iterations=3, warmup=1)
    assert note is None
    table = Profile.model_validate(profile).batch(8)
    on_dla = [layer for layer in table.layers if layer.device == "dla" and layer.kind != "DLA transfer"]
    assert len(on_dla) == 1 and on_dla[0].name.startswith("{ForeignNode[Conv") and "GlobalAveragePool" in on_dla[0].name
    assert {name.split("_")[0] for name in table.fallback_layers} >= {"Flatten", "Gemm"} and 0 < table.dla_share < 1
    assert all(layer.precision == "fp16" for layer in table.layers if layer.kind != "DLA transfer")


def test_dla_on_a_board_without_dla_cores_is_refused(monkeypatch, tmp_path, float_model):
    trt_standin.install(monkeypatch, "10.3.0", dla_cores=0,
                        board="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super")
    with pytest.raises(DlaError, match="has 0 DLA core"):
        runner(float_model, tmp_path, batch_sizes=(1,), dla_core=0).load()


# ------------------------------------------------------------------ point 4: TensorRT 11
def test_tensorrt_11_builds_the_q_dq_model_strongly_typed(monkeypatch, tmp_path, qdq_model):
    trt_standin.install(monkeypatch, "11.1.0")
    with runner(qdq_model, tmp_path, batch_sizes=(4,), precision="int8") as trt_runner:
        assert trt_runner.precision_built == "int8"
        assert "--int8" not in trt_runner.trtexec[4] and "--fp16" not in trt_runner.trtexec[4]
        profile, _ = profile_runner(trt_runner, [4], (3, 16, 16), iterations=2, warmup=0)
    table = Profile.model_validate(profile).batches[0]
    precisions = {layer.name: layer.precision for layer in table.layers}
    assert precisions["conv"] == "int8" and precisions["head"] == "fp32"  # the Gemm head is left in float
    assert 0 < table.int8_share < 1 and "head" in table.float_left_behind and "conv" not in table.float_left_behind


def test_tensorrt_11_refuses_a_label_the_artifact_contradicts(monkeypatch, tmp_path, qdq_model, float_model):
    trt_standin.install(monkeypatch, "11.4.1", dla_cores=2, board=AGX_ORIN)
    with pytest.raises(PrecisionMismatchError, match="no Q/DQ nodes"):
        runner(float_model, tmp_path, batch_sizes=(1,), precision="int8").load()
    with pytest.raises(PrecisionMismatchError, match="weights are FP32"):
        runner(float_model, tmp_path, batch_sizes=(1,), precision="fp16").load()
    with pytest.raises(DlaError, match="FP32 artifact cannot run on the DLA"):
        runner(float_model, tmp_path, batch_sizes=(1,), precision="fp32", dla_core=0).load()
    with runner(qdq_model, tmp_path, batch_sizes=(1,), precision="int8", dla_core=0) as trt_runner:
        assert trt_runner.device.startswith("dla:0")


def test_tensorrt_11_3_has_no_dla(monkeypatch, tmp_path, qdq_model):
    trt_standin.install(monkeypatch, "11.3.0", dla_cores=2, board=AGX_ORIN)
    with pytest.raises(DlaError, match="11.0–11.3"):
        runner(qdq_model, tmp_path, batch_sizes=(1,), precision="int8", dla_core=0).load()


# ------------------------------------------------------------------ point 6: static batch, 10.12+
def test_a_static_batch_onnx_is_named_not_blamed_on_the_workspace(monkeypatch, tmp_path, float_model):
    model = onnx.load(str(float_model))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 1
    static = tmp_path / "static.onnx"
    onnx.save(model, str(static))
    trt_standin.install(monkeypatch, "10.3.0")
    with pytest.raises(StaticShapeError, match="static batch of 1") as err:
        runner(static, tmp_path, batch_sizes=(1, 8)).load()
    assert "dynamic batch axis" in err.value.fix and "workspace" not in err.value.fix
    with runner(static, tmp_path, batch_sizes=(1,)) as trt_runner:  # its own batch builds fine
        assert trt_runner.infer(np.zeros((1, 3, 16, 16), np.float32)).shape == (1, 10)
        # trtexec refuses explicit shapes for a static model (sampleEngines.cpp, v10.3.0 and v10.16): the line
        # recorded for this build gives none, like the build itself, which adds no optimization profile.
        line = trt_runner.trtexec[1]
        assert line.startswith("trtexec --onnx=") and "Shapes=" not in line


def test_tensorrt_10_16_builds_int8_strongly_typed(monkeypatch, tmp_path, qdq_model):
    """The stand-in refuses INT8/FP16 flags on a strongly typed network; 10.16 uses no flags at all."""
    trt = trt_standin.install(monkeypatch, "10.16.0")
    with runner(qdq_model, tmp_path, batch_sizes=(2,), precision="int8") as trt_runner:
        assert "--stronglyTyped" in trt_runner.trtexec[2] and "--int8" not in trt_runner.trtexec[2]
        assert trt_runner.infer(np.zeros((2, 3, 16, 16), np.float32)).shape == (2, 10)
    assert trt.log == []


# ------------------------------------------------------------------ the first try on a real board
def test_out_of_memory_context_is_a_runner_error_with_the_fix(monkeypatch, tmp_path, float_model):
    """create_execution_context() returns None when the device memory runs out (an 8 GB Orin Nano)."""
    trt = trt_standin.install(monkeypatch, "10.3.0", device_memory_bytes=1)
    from device.errors import RunnerError

    with pytest.raises(RunnerError, match="could not create an execution context for the batch-8") as err:
        runner(float_model, tmp_path, batch_sizes=(8,)).load()
    assert "smaller batch sizes" in err.value.fix and any("out of device memory" in line for line in trt.log)


def test_corrupt_timing_cache_is_named_and_a_new_one_is_written_whole(monkeypatch, tmp_path, float_model):
    """create_timing_cache() returns None on a blob it cannot read: the error names the file and the fix."""
    trt_standin.install(monkeypatch, "10.3.0")
    from device.runners.engine import BuildOptions, build_engine

    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"\x00truncated")
    with pytest.raises(TimingCacheError, match="could not read the timing cache") as err:
        build_engine(float_model, BuildOptions(precision="fp32", timing_cache=str(cache)), tmp_path / "e.plan")
    assert f"delete {cache}" in err.value.fix
    cache.unlink()
    build_engine(float_model, BuildOptions(precision="fp32", timing_cache=str(cache)), tmp_path / "e.plan")
    assert cache.read_bytes().startswith(b"STANDIN-CACHE:")
    assert sorted(p.name for p in tmp_path.iterdir() if "cache" in p.name) == ["timing.cache"]  # no temp file left


@pytest.mark.parametrize("version", ["10.8.0", "10.12.0", "10.16.1"])
def test_dla_is_refused_on_tensorrt_10_8_to_10_16(monkeypatch, tmp_path, qdq_model, version):
    """NVIDIA's TensorRT 11.x "Working with DLA": 10.7 was the last 10.x with DLA, whatever the core count."""
    trt_standin.install(monkeypatch, version, dla_cores=2, board=AGX_ORIN)
    with pytest.raises(DlaError, match="10.7 as the last 10.x release with DLA"):
        runner(qdq_model, tmp_path, batch_sizes=(1,), precision="int8", dla_core=0).load()


def test_dla_transfers_are_dla_time_not_gpu_fallback(monkeypatch, tmp_path, qdq_model):
    """The profiler's "… to nvm", "… from nvm", "… copy finish" entries (NVIDIA/TensorRT#3143) are the
    DLA's own I/O; the Q/DQ and Constant layers the parser made are not "refused by the DLA"."""
    trt_standin.install(monkeypatch, "10.3.0", dla_cores=2, board=AGX_ORIN)
    with runner(qdq_model, tmp_path, batch_sizes=(2,), precision="int8", dla_core=0) as trt_runner:
        assert trt_runner.dla_unsupported_layers == ["head"]  # not dequant_w, w_int8_constant, flatten
        profile, note = profile_runner(trt_runner, [2], (3, 16, 16), iterations=3, warmup=1)
    table = Profile.model_validate(profile).batch(2)
    transfers = [layer for layer in table.layers if layer.kind == "DLA transfer"]
    assert {layer.name for layer in transfers} == {"input to nvm", "logits from nvm", "input copy finish",
                                                   "logits copy finish"}
    assert all(layer.device == "dla" for layer in transfers)
    assert not set(table.fallback_layers) & {layer.name for layer in transfers}
    assert "head" in table.fallback_layers


def test_half_io_engine_takes_float32_batches(monkeypatch, tmp_path):
    """An FP16 ONNX keeps HALF I/O in the engine: the runner converts into the pinned buffer and back."""
    from onnxconverter_common import float16

    model = onnx.load(str(tiny_onnx(tmp_path / "float.onnx")))
    half = tmp_path / "half.onnx"
    onnx.save(float16.convert_float_to_float16(model, keep_io_types=False), str(half))
    trt_standin.install(monkeypatch, "11.1.0")
    batch = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "ref.onnx"))) as reference:
        expected = reference.infer(batch)
    with runner(half, tmp_path, batch_sizes=(2,), precision="fp16") as trt_runner:
        assert trt_runner.dtypes[trt_runner.inputs[0]] == np.float16
        out = trt_runner.infer(batch)
    assert out.dtype == np.float16 and np.allclose(out.astype(np.float32), expected, atol=5e-2)


def test_timed_call_reports_trtexec_latency_and_gpu_compute(monkeypatch, tmp_path, float_model):
    """Each call leaves trtexec's two device times (CUDA events) beside the wall time the caller takes;
    the input shape is set once at load, and the host buffers are pinned."""
    trt_standin.install(monkeypatch, "10.3.0")
    with runner(float_model, tmp_path, batch_sizes=(4,)) as trt_runner:
        context = trt_runner._engines[4].context
        calls = []
        monkeypatch.setattr(context, "set_input_shape", lambda *a: calls.append(a) or True)
        trt_runner.infer(np.zeros((4, 3, 16, 16), np.float32))
        times = trt_runner.last_device_ms
        assert calls == []  # not per call
        assert set(times) == {"latency_ms", "gpu_compute_ms", "h2d_ms", "d2h_ms"}
        assert 0 < times["gpu_compute_ms"] <= times["latency_ms"]
        # the copies timed apart by the same events (a frame job's copies_ms): the three add up to the latency
        assert times["h2d_ms"] >= 0 and times["d2h_ms"] >= 0
        assert times["h2d_ms"] + times["gpu_compute_ms"] + times["d2h_ms"] == pytest.approx(times["latency_ms"])
        assert trt_runner.cuda.pinned_bytes >= 4 * 3 * 16 * 16 * 4
        # The host sleeps on the call's last event (blocking sync, trtexec's default without --useSpinWait), never on
        # a spinning stream synchronize; the build facts say so.
        end = trt_runner._events[-1]
        assert trt_runner.cuda.blocking_events == {end} and trt_runner.cuda.waited == [end]
        from device.runners.base import build_facts

        assert build_facts(trt_runner)["host_wait"] == "blocking-sync event"


def test_job_result_and_report_carry_three_latencies(monkeypatch, tmp_path, float_model):
    """A TensorRT job's result has trtexec's Latency and GPU Compute beside the wall time, and the report
    shows all three, each with its interval over the windows and named for what it is."""
    from device.files import sha256_file
    from device.jobs.jobrun import run_job
    from device.schema import JobResult
    from pipeline.report.profile_report import TIMINGS_TEXT, timing_rows
    from pipeline.tasks.classification.report_data import _window_statistics

    trt_standin.install(monkeypatch, "10.3.0")
    job = {"spec": {"artifact": sha256_file(float_model), "runtime": "tensorrt", "precision": "fp32",
                    "batch_sizes": [2], "iterations": 6, "warmup_iterations": 1, "idle_s": 0.0,
                    "telemetry": ["host"], "profile": False},
           "artifact_path": str(float_model), "engine_cache": str(tmp_path / "engines")}
    rounds = [JobResult.model_validate(run_job(job, tmp_path)) for _ in range(3)]
    timing = rounds[0].runs[0].device_timing
    assert timing is not None and "CUDA events" in timing.method
    assert 0 < timing.gpu_compute_p50_ms <= timing.latency_p50_ms
    row = {"rung": "student", "device": "orin", "runtime": "tensorrt", "precision": "fp32", "status": "measured",
           **_window_statistics(rounds, 2, 2)}
    assert row["trt_latency_p50_low_ms"] <= row["trt_latency_p50_ms"] <= row["trt_latency_p50_high_ms"]
    assert row["gpu_compute_p50_ms"] <= row["trt_latency_p50_ms"]
    header, cells = timing_rows({"rows": [row]})
    assert header[3:] == ["wall p50 ms", "trtexec Latency p50 ms", "GPU Compute p50 ms"]
    assert all(cell != "—" and "[" in cell for cell in cells[3:])
    assert "GPU Compute Time" in TIMINGS_TEXT and "pinned" in TIMINGS_TEXT and "--exposeDMA" in TIMINGS_TEXT


def test_each_runtime_reports_its_own_facts(monkeypatch, tmp_path, float_model):
    """The result's runtime section carries what each runner reports of itself (Runner.runtime_facts): TensorRT
    what it built (engine, precision, the trtexec line per batch) under ``built``, ONNX Runtime its providers."""
    from device.files import sha256_file
    from device.jobs.jobrun import run_job
    from device.schema import JobResult

    spec = {"artifact": sha256_file(float_model), "precision": "fp32", "batch_sizes": [2], "iterations": 3,
            "warmup_iterations": 1, "idle_s": 0.0, "telemetry": ["host"], "profile": False}
    job = {"artifact_path": str(float_model), "engine_cache": str(tmp_path / "engines")}
    onnxruntime = JobResult.model_validate(run_job({**job, "spec": {**spec, "runtime": "onnxruntime"}}, tmp_path))
    assert onnxruntime.runtime.providers == ["CPUExecutionProvider"] and onnxruntime.runtime.built is None
    trt_standin.install(monkeypatch, "10.3.0")
    tensorrt = JobResult.model_validate(run_job({**job, "spec": {**spec, "runtime": "tensorrt"}}, tmp_path)).runtime
    assert tensorrt.providers is None and tensorrt.device == "gpu"
    assert tensorrt.built.precision_built == "fp32" and tensorrt.built.built_now and tensorrt.built.engine_path
    assert tensorrt.built.trtexec[2].startswith("trtexec --onnx=") and "--fp16" not in tensorrt.built.trtexec[2]


# ------------------------------------------------------------------ score the engine that was timed
def test_fp16_artifact_builds_strongly_typed_on_tensorrt_11(monkeypatch, tmp_path, half_model):
    """The FP16 rung's precision is in its graph: TensorRT 11 (no flags) builds it FP16, float32 I/O kept."""
    trt_standin.install(monkeypatch, "11.1.0")
    with runner(half_model, tmp_path, batch_sizes=(4,), precision="fp16") as trt_runner:
        assert trt_runner.precision_built == "fp16" and trt_runner.dtypes[trt_runner.inputs[0]] == np.float32
        assert "--fp16" not in trt_runner.trtexec[4] and "--stronglyTyped" not in trt_runner.trtexec[4]
        profile, _ = profile_runner(trt_runner, [4], (3, 16, 16), iterations=2, warmup=0)
    layers = Profile.model_validate(profile).batches[0].layers
    assert {layer.precision for layer in layers if layer.kind in ("CaskConvolution", "CaskGemmConvolution")} == {"fp16"}


def _evaluation_set(tmp_path, images=37, seed=3):
    path = tmp_path / "eval.npy"
    np.save(path, np.random.default_rng(seed).standard_normal((images, 3, 16, 16)).astype(np.float32))
    return path


def _job(model, tmp_path, eval_path, images, artifact=None, precision="fp32"):
    from device.files import sha256_file

    return {"spec": {"artifact": sha256_file(model), "runtime": "tensorrt", "precision": precision,
                     "batch_sizes": [1, 8], "iterations": 3, "warmup_iterations": 0, "idle_s": 0.0,
                     "telemetry": ["host"], "profile": False,
                     "evaluation": {"artifact": artifact or sha256_file(eval_path), "images": images, "top_k": 5}},
            "artifact_path": str(model), "engine_cache": str(tmp_path / "engines"), "evaluation_path": str(eval_path)}


def test_a_planted_tensorrt_deviation_from_the_host_is_found_and_flagged(monkeypatch, tmp_path, float_model):
    """The evaluation set runs through the engine that was timed (last batch padded: 37 = 4×8 + 5); a stand-in
    engine that swaps the top two classes for every third image (a planted "fused INT8 layer") is told apart
    from the host's ONNX Runtime predictions, and the headline says so with the likely causes."""
    from device.jobs.jobrun import run_job
    from device.schema import JobResult
    from pipeline.tasks.classification.device_accuracy import device_scores
    from pipeline.tasks.classification.report import headline_text

    eval_path = _evaluation_set(tmp_path)
    with make_runner("onnxruntime", str(float_model)) as host:
        host_logits = host.infer(np.load(eval_path))
    host_top1 = host_logits.argmax(1)
    record = {"labels": host_top1.tolist(), "host_top1": {"student_int8": host_top1.tolist()},
              "classes": [str(c) for c in range(10)]}  # labels = the host's answers: the host is 100% right

    trt_standin.install(monkeypatch, "10.3.0")
    same = JobResult.model_validate(run_job(_job(float_model, tmp_path, eval_path, 37), tmp_path)).evaluation
    assert same.batch_size == 8 and len(same.predictions) == 37 and len(same.predictions[0]) == 5
    faithful = device_scores(record, "student_int8", same.predictions)
    assert faithful["agreement"] == 1.0 and not faithful["device_deviates"]

    trt = trt_standin.install(monkeypatch, "10.3.0")
    trt.planted_swap_every = 3  # the stand-in's planted deviation (trt_standin.make_tensorrt)
    planted = JobResult.model_validate(run_job(_job(float_model, tmp_path / "b", eval_path, 37), tmp_path)).evaluation
    scores = device_scores(record, "student_int8", planted.predictions)
    swapped = sum(len(range(0, min(8, 37 - start), 3)) for start in range(0, 37, 8))  # per call of 8: rows 0, 3, 6
    assert swapped == 14 and scores["device_top1_correct"] == 37 - swapped and scores["only_host_correct"] == swapped
    assert scores["device_deviates"] and scores["mcnemar_p"] < 0.001
    text = headline_text({"status": "measured", "edge_device": "orin", "dc_device": "orin", "top1_edge": 0.9,
                          "top1_dc": 0.9, "accuracy_lost_points": 0.0, "latency_p50_ms_edge": 1.0,
                          "latency_p50_ms_dc": 1.0, "throughput_edge": 1.0, "throughput_dc": 1.0,
                          "energy_mj_edge": None, "energy_mj_dc": None, "size_mb_edge": 1.0, "size_mb_dc": 1.0,
                          "device_deviations": [{"rung": "student_int8", "device": "orin",
                                                 "device_top1": scores["device_top1"], "host_top1": 1.0,
                                                 "images": 37, "mcnemar_p": scores["mcnemar_p"]}]})
    assert "student_int8 on orin: 62.16% on the device vs 100.00% on the host" in text
    assert "differs by more than noise" in text and "fused INT8 layer" in text and "per-layer profile" in text


def test_every_timed_engine_is_scored_and_one_that_parts_from_the_others_is_found(monkeypatch, tmp_path,
                                                                                  float_model):
    """TensorRT builds one engine per measured batch, and weakly typed 10.3 may give each other precisions: the set
    runs through each (batch 8 first, the result's ``evaluation``; batch 1 in ``more_evaluations``). A deviation
    planted in the batch-1 engine only is invisible in the batch-8 score and found in its own."""
    from device.jobs.jobrun import run_job
    from device.schema import JobResult
    from pipeline.tasks.classification.device_accuracy import device_scores

    eval_path = _evaluation_set(tmp_path)
    with make_runner("onnxruntime", str(float_model)) as host:
        host_top1 = host.infer(np.load(eval_path)).argmax(1)
    record = {"labels": host_top1.tolist(), "host_top1": {"student_int8": host_top1.tolist()}}
    trt = trt_standin.install(monkeypatch, "10.3.0")
    trt.planted_swap_every, trt.planted_swap_batches = 3, {1}
    result = JobResult.model_validate(run_job(_job(float_model, tmp_path, eval_path, 37), tmp_path))
    assert result.evaluation.batch_size == 8 and result.evaluation_note is None
    assert [(e.batch_size, e.accelerator) for e in result.more_evaluations] == [(1, None)]
    assert device_scores(record, "student_int8", result.evaluation.predictions)["agreement"] == 1.0
    one = device_scores(record, "student_int8", result.more_evaluations[0].predictions)
    assert one["only_host_correct"] == 37 and one["device_deviates"]  # row 0 of every single-image call swapped
    # The report scores each engine and names the one that parts, in its table and its headline's deviations.
    from pipeline.tasks.classification.report import device_accuracy_rows
    from pipeline.tasks.classification.report_data import engines_scored

    engines = engines_scored(record, "student_int8", result)
    assert [(e["label"], e["device_deviates"]) for e in engines] == [("batch 8", False), ("batch 1", True)]
    row = {"rung": "student_int8", "device": "orin", "runtime": "tensorrt", "precision": "fp32", "device_images": 37,
           "host_top1_same_images": 1.0, "host_top1_correct_same_images": 37, **engines[0], "engines_scored": engines}
    table = device_accuracy_rows({"rows": [row]})
    assert [line[0] for line in table[1:]] == ["student_int8", "student_int8 · batch 1"]
    assert table[2][3] == "0.00% (0/37)" and table[2][-1] == "differs by more than noise"


def test_a_runtime_with_one_model_for_every_batch_is_scored_once_and_says_so(tmp_path, float_model):
    from device.jobs.jobrun import run_job
    from device.schema import JobResult

    eval_path = _evaluation_set(tmp_path)
    job = _job(float_model, tmp_path, eval_path, 37)
    job["spec"]["runtime"] = "onnxruntime"
    result = JobResult.model_validate(run_job(job, tmp_path))
    assert result.more_evaluations == [] and result.evaluation.batch_size == 8
    assert result.evaluation_note == "one onnxruntime model serves every batch size: scored once, at batch 8"


def test_an_evaluation_set_that_is_not_the_jobs_is_refused(monkeypatch, tmp_path, float_model):
    """Its hash or its shape against the model's input: named, with the fix, never scored."""
    from device.scoring.evaluation import EvaluationSetError
    from device.jobs.jobrun import run_job

    trt_standin.install(monkeypatch, "10.3.0")
    eval_path = _evaluation_set(tmp_path)
    with pytest.raises(EvaluationSetError, match="hash to sha256 .* not 0000") as err:
        run_job(_job(float_model, tmp_path, eval_path, 37, artifact="0" * 64), tmp_path)
    assert "upload the set again" in err.value.fix
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((4, 3, 8, 8), np.float32))
    with pytest.raises(EvaluationSetError, match=r"shape \(4, 3, 8, 8\), but the model takes float32 N×3×16×16"):
        run_job(_job(float_model, tmp_path, wrong, 4), tmp_path)
    with pytest.raises(EvaluationSetError, match="holds 37 images, the job says 40"):
        run_job(_job(float_model, tmp_path, eval_path, 40), tmp_path)


def test_builds_naming_one_timing_cache_share_its_file(monkeypatch, tmp_path, float_model, half_model):
    """A latency table's engine builds name one timing cache (JobSpec.timing_cache): the agent resolves the name
    to one file beside its engines, the first build writes it, the next reads and rewrites it; a job without a
    name builds without one."""
    from device.runners import timing_cache_path
    from device.schema import JobSpec

    trt_standin.install(monkeypatch, "10.3.0")
    engines = tmp_path / "engines"
    cache = engines / "timing" / "latency-table.cache"
    with runner(float_model, tmp_path, timing_cache="latency-table") as first:
        assert first.options.timing_cache == str(cache)
    assert cache.read_bytes().startswith(b"STANDIN-CACHE:")
    written = cache.stat().st_mtime_ns
    with runner(half_model, tmp_path, precision="fp16", timing_cache="latency-table") as second:
        assert second.options.timing_cache == str(cache)
    assert cache.stat().st_mtime_ns >= written and len(list(cache.parent.iterdir())) == 1, "one shared file"
    with runner(float_model, tmp_path) as plain:
        assert plain.options.timing_cache is None
    assert timing_cache_path(None, "latency-table") is None and timing_cache_path(str(engines), None) is None
    with pytest.raises(ValueError, match="timing_cache needs runtime 'tensorrt'"):
        JobSpec.model_validate({"artifact": "0" * 64, "runtime": "onnxruntime", "timing_cache": "t"})
    with pytest.raises(ValueError, match="timing_cache"):
        JobSpec.model_validate({"artifact": "0" * 64, "runtime": "tensorrt", "timing_cache": "../escape"})


def test_closing_a_runner_destroys_its_cuda_stream(monkeypatch, tmp_path, float_model):
    """A sweep keeps a runner per accelerator and a job per batch; each stream is given back when its runner closes
    (the stand-in's CUDA refuses a stream destroyed twice)."""
    trt_standin.install(monkeypatch, "10.3.0")
    trt_runner = runner(float_model, tmp_path, batch_sizes=(1, 2))
    trt_runner.load()
    cuda, stream = trt_runner.cuda, trt_runner.stream
    assert cuda.streams == {stream}
    trt_runner.close()
    assert cuda.streams == set() and cuda.streams_destroyed == [stream]
    trt_runner.close()  # twice is harmless


@pytest.mark.parametrize("version, pinned", [("10.3.0", True), ("11.1.0", False)])
def test_the_frame_prefix_stays_fp32_in_an_fp16_engine_and_takes_a_uint8_frame(monkeypatch, tmp_path, half_model,
                                                                                 version, pinned):
    """The FP16 rung with a frame job's preprocessing in its graph: on TensorRT 10.3 (the FP16 builder flag, not
    strongly typed) the prefix's float layers are pinned to FP32 with the precision-constraint flag, and build.json's
    trtexec line says so; on 11 (strongly typed: the ONNX's types) nothing is pinned. Either engine takes the uint8
    frame and answers as ONNX Runtime does."""
    from device.jobs.frame import InGraphPath, synthetic_frames
    from device.jobs.frame_schema import FrameSpec
    from device.preprocess import Preprocess
    from pipeline.deploy.frame_prefix import write_prefixed

    preprocess, spec = Preprocess(16, 18, 3, (0.5,) * 3, (0.25,) * 3), FrameSpec(width=64, height=48, format="nv12")
    prefixed = write_prefixed(half_model, preprocess, spec, tmp_path / "frame-half.onnx")
    trt_standin.install(monkeypatch, version)
    frame = synthetic_frames(spec, 1)[0]
    with runner(prefixed, tmp_path, batch_sizes=(1,), precision="fp16") as trt_runner, \
            make_runner("onnxruntime", str(prefixed)) as ort_runner:
        assert trt_runner.precision_built == "fp16" and trt_runner.dtypes[trt_runner.inputs[0]] == np.uint8
        batch = InGraphPath(trt_runner, preprocess, spec).prepare(frame)
        assert np.allclose(trt_runner.infer(batch), ort_runner.infer(batch), atol=1e-2)
    built = json.loads(next((tmp_path / "engines").rglob("build.json")).read_text())
    layers = json.loads(next((tmp_path / "engines").rglob("engine.plan")).read_bytes())["layers"]
    prefix = [layer for layer in layers if layer["name"].startswith("frame_prefix/")]
    network = [layer for layer in layers if not layer["name"].startswith("frame_prefix/")]
    assert prefix and {layer["precision"] for layer in network if layer["op"] == "Conv"} == {"fp16"}
    assert {layer["precision"] for layer in prefix if layer["op"] not in ("Shape", "Slice", "Concat")} == {"fp32"}
    if pinned:  # the float layers pinned (10.3); its shape arithmetic (INT64) left alone
        assert built["fp32_layers"] and not any("Shape" in name for name in built["fp32_layers"])
        assert "--precisionConstraints=prefer" in built["trtexec"] and "frame_prefix/Cast" in built["trtexec"]
    else:
        assert built["fp32_layers"] == [] and "--precisionConstraints" not in built["trtexec"]


def test_bfloat16_io_and_marked_tensors_are_carried_and_fp8_is_refused_by_name(monkeypatch, tmp_path, float_model):
    """TensorRT's nptype has no NumPy type for BF16, FP8 or INT4 and raises TypeError (tensorrt/__init__.py, v10.3.0
    and v11.1): a BF16 input, output or marked tensor travels as its 16 bits and is widened; FP8 is refused with the
    tensor's name and the fix (the stand-in plants the types a strongly typed network would report)."""
    from device.errors import RunnerError

    trt = trt_standin.install(monkeypatch, "10.3.0")
    trt.planted_io_types.update(input="bf16", output="bf16", marked="bf16")
    batch = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    with make_runner("onnxruntime", str(float_model)) as reference:
        expected = reference.infer(batch)
    with runner(float_model, tmp_path, batch_sizes=(2,), marked=("relu",)) as trt_runner:
        assert trt_runner.dtypes[trt_runner.inputs[0]] == np.uint16 and trt_runner.bfloat16 >= {"input", "relu"}
        out = trt_runner.infer(batch)
        relu = trt_runner.run_marked(batch)["relu"]
    # bfloat16 keeps 8 bits of mantissa: within 1% of the float32 values (the input rounded, the output truncated).
    assert out.dtype == np.float32 and np.allclose(out, expected, rtol=2e-2, atol=2e-2)
    assert relu.dtype == np.float32 and relu.min() >= 0 and relu.shape[0] == 2
    trt.planted_io_types.clear()
    trt.planted_io_types["marked"] = "fp8"
    with pytest.raises(RunnerError, match="tensor 'relu' is of type FP8, which has no host type") as err:
        with runner(float_model, tmp_path / "fp8", batch_sizes=(2,), marked=("relu",)):
            pass
    assert "mark a tensor before its quantize" in err.value.fix


@pytest.mark.parametrize("version", ["10.3.0", "11.1.0"])
def test_an_fp32_engine_is_built_without_tf32_and_its_trtexec_line_says_so(monkeypatch, tmp_path, float_model,
                                                                           half_model, version):
    """BuilderFlag.TF32 is on by default (NvInfer.h; trtexec unless --noTF32): an fp32 rung is IEEE FP32 math, the
    reference its FP16 and INT8 forms are held against, so its build clears it; the FP16 rung keeps TensorRT's
    default."""
    trt_standin.install(monkeypatch, version)
    with runner(float_model, tmp_path / "fp32", batch_sizes=(2,)) as fp32:
        plan = json.loads(fp32._engines[2].path.read_bytes())
        assert plan["tf32"] is False and "--noTF32" in fp32.trtexec[2]
    if version.startswith("10"):
        with runner(half_model, tmp_path / "fp16", batch_sizes=(2,), precision="fp16") as fp16:
            assert json.loads(fp16._engines[2].path.read_bytes())["tf32"] is True
            assert "--noTF32" not in fp16.trtexec[2]

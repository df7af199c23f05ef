"""The agent's torch_tensorrt runtime against the Torch-TensorRT STAND-IN (tests/device/torch_tensorrt_standin.py),
for JetPack 6's release (2.5), a middle one (2.9) and the newest read (2.14); the real one where it exists."""

from __future__ import annotations

import importlib.util
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from device.errors import ConfigError, PrecisionMismatchError, ProgramVersionError
from device.runners import RUNNERS, make_runner
from device.runners.torch_tensorrt import ProgramVersions, check_program_versions, read_program_versions
from device.runners.torch_tensorrt_rules import RULES, compile_arguments, rules_for
from tests.device.agent_process import AgentProcess
from tests.slow import slow_fixture

torch = pytest.importorskip("torch")


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """A float torch.export program as the export stage writes it (batch axis dynamic, torch version recorded)."""
    model = tiny_model()
    path = tmp_path_factory.mktemp("pt2") / "student.pt2"
    exported = torch.export.export(model, (torch.zeros(2, 3, 16, 16),),
                                   dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
    torch.export.save(exported, path, extra_files={"edgefold.json": json.dumps({"torch": torch.__version__})})
    return model, path


def standin(monkeypatch, version: str, cpp_runtime: bool = True):
    """Installs the stand-in for ``version`` in this test only (compiling for the CPU)."""
    import device.runners.torch_tensorrt as runtime
    from tests.device import trt_standin
    from tests.device.torch_tensorrt_standin import make_torch_tensorrt, with_spec

    tt = make_torch_tensorrt(version, cpp_runtime=cpp_runtime)
    monkeypatch.setitem(sys.modules, "torch_tensorrt", tt)
    monkeypatch.setitem(sys.modules, "tensorrt", with_spec(trt_standin.make_tensorrt("10.3.0", 0), "tensorrt"))
    monkeypatch.setattr(runtime, "compute_device", lambda torch: torch.device("cpu"))
    monkeypatch.setattr(runtime, "detect_gpu", lambda **_: (trt_standin.STANDIN_DEVICE, "8.7"))
    return tt


# ------------------------------------------------------------------ the release table
def test_registered_beside_the_other_runtimes():
    assert "torch_tensorrt" in RUNNERS.names()


def test_each_release_gets_its_own_precision_arguments_and_every_rule_cites_a_tag():
    one = {"min_block_size": 1}  # every convertible op compiled, as upstream's INT8 example (the default is 5)
    assert compile_arguments(rules_for("2.5.0a0+jetson"), "fp16") == {"enabled_precisions": ("float16",), **one}
    # INT8 with FP16 beside it where the release is weakly typed: the float islands build FP16, as on the ONNX road.
    assert compile_arguments(rules_for("2.5.0"), "int8") == {"enabled_precisions": ("int8", "float16"), **one}
    assert compile_arguments(rules_for("2.9.0"), "fp16") == {"use_explicit_typing": True, **one}
    assert compile_arguments(rules_for("2.9.0"), "int8") == {"enabled_precisions": ("int8", "float16"), **one}
    assert compile_arguments(rules_for("2.14.0"), "fp16") == one
    assert compile_arguments(rules_for("2.13.0"), "int8") == one
    assert rules_for("2.8.0")["int8_float_islands"].value == "fp16"
    assert rules_for("2.13.0")["int8_float_islands"].value.startswith("the graph's dtype")
    assert all("@" in rule.source and rule.source.startswith(("py/", "docsrc/", "examples/", "core/"))
               for rule in RULES)
    # Every release read gets exactly one rule of each name.
    for version in ("2.3.0", "2.5.0", "2.6.0", "2.12.0", "2.13.0", "2.14.0"):
        names = [r.name for r in RULES if r.since <= tuple(map(int, version.split(".")[:2]))
                 and (r.until is None or tuple(map(int, version.split(".")[:2])) < r.until)]
        assert len(names) == len(set(names)) and "precision_arguments" in names


def test_a_release_older_than_any_read_is_refused():
    with pytest.raises(ConfigError, match="older than 2.3"):
        rules_for("2.2.0")
    with pytest.raises(ConfigError, match="cannot read"):
        rules_for("nightly")


@pytest.mark.parametrize("version", ["2.5.0", "2.9.0", "2.14.0"])
def test_standin_accepts_exactly_what_its_release_documents(version):
    from tests.device.torch_tensorrt_standin import make_torch_tensorrt

    tt = make_torch_tensorrt(version)
    program = torch.export.export(tiny_model(), (torch.zeros(1, 3, 16, 16),))
    spec = [tt.Input(shape=(1, 3, 16, 16), dtype=torch.float32)]
    removed = {"2.5.0": "use_explicit_typing", "2.9.0": "make_it_fast", "2.14.0": "enabled_precisions"}[version]
    with pytest.raises(TypeError, match=removed):
        tt.dynamo.compile(program, inputs=spec, **{removed: True})
    with pytest.raises(AssertionError, match="static"):
        tt.dynamo.compile(program, inputs=[tt.Input(min_shape=(1, 3, 16, 16), opt_shape=(2, 3, 16, 16),
                                                     max_shape=(4, 3, 16, 16))])


def test_standin_keeps_the_explicit_typing_assertion_of_2_6_to_2_12():
    from tests.device.torch_tensorrt_standin import make_torch_tensorrt

    tt = make_torch_tensorrt("2.9.0")
    program = torch.export.export(tiny_model(), (torch.zeros(1, 3, 16, 16),))
    with pytest.raises(AssertionError, match="use_explicit_typing"):
        tt.dynamo.compile(program, inputs=[tt.Input(shape=(1, 3, 16, 16))], use_explicit_typing=True,
                          enabled_precisions={torch.float16})


# ------------------------------------------------------------------ the runner
@pytest.mark.parametrize("version,expected", [("2.5.0", {"enabled_precisions": {torch.float32}, "min_block_size": 1}),
                                              ("2.9.0", {"use_explicit_typing": True, "min_block_size": 1}),
                                              ("2.14.0", {"min_block_size": 1})])
def test_runner_compiles_each_batch_with_its_release_arguments(monkeypatch, tmp_path, program, version, expected):
    model, path = program
    tt = standin(monkeypatch, version)
    with make_runner("torch_tensorrt", str(path), trust_programs=True, batch_sizes=(1, 4), engine_cache=str(tmp_path)) as runner:
        batch = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
        out = runner.infer(batch)
        with torch.inference_mode():
            eager = model(torch.from_numpy(batch)).numpy()
        np.testing.assert_allclose(out, eager, rtol=1e-4, atol=1e-5)
        assert runner.infer(batch[:1]).shape == (1, 5)
        info = runner.torch_tensorrt
    assert [call["inputs"] for call in tt.calls] == [[((1, 3, 16, 16), torch.float32)],
                                                     [((4, 3, 16, 16), torch.float32)]]
    assert all(call["kwargs"] == expected for call in tt.calls)
    assert info["version"] == version and runner.precision_built == "fp32"
    assert "v2.5.0" in info["rules"]["static_input"]


def test_runner_reports_the_ops_that_fell_back_by_name_and_count(monkeypatch, tmp_path, program):
    _, path = program
    standin(monkeypatch, "2.5.0")
    with make_runner("torch_tensorrt", str(path), trust_programs=True, batch_sizes=(2,), engine_cache=str(tmp_path)) as runner:
        report = runner.torch_tensorrt["fallback"][2]
    assert report["fallback_ops"] == {"aten.adaptive_avg_pool2d.default": 1}
    assert report["fallback_count"] == 1 and runner.torch_tensorrt["fallback_count"] == 1
    # conv+relu before the pool, flatten+linear after it: two TensorRT engines around one PyTorch island.
    assert report["engines"] == 2 and all(name.startswith("_run_on_acc") for name in report["engine_submodules"])


def test_runner_casts_an_fp32_program_to_fp16_before_compiling(monkeypatch, tmp_path, program):
    _, path = program
    tt = standin(monkeypatch, "2.9.0")
    with make_runner("torch_tensorrt", str(path), trust_programs=True, precision="fp16", batch_sizes=(1,),
                     engine_cache=str(tmp_path)) as runner:
        out = runner.infer(np.zeros((1, 3, 16, 16), np.float32))
    assert out.dtype == np.float32 and runner.precision_built == "fp16"
    assert tt.calls[0]["inputs"] == [((1, 3, 16, 16), torch.float16)]
    assert tt.calls[0]["kwargs"] == {"use_explicit_typing": True, "min_block_size": 1}


def test_compiled_programs_are_cached_by_the_engine_fingerprint(monkeypatch, tmp_path, program):
    _, path = program
    tt = standin(monkeypatch, "2.5.0")
    with make_runner("torch_tensorrt", str(path), trust_programs=True, batch_sizes=(1,), engine_cache=str(tmp_path)) as first:
        first_out = first.infer(np.ones((1, 3, 16, 16), np.float32))
    assert first.built_now and len(tt.calls) == 1
    recorded = json.loads((first.engine_path / "fingerprint.json").read_text())
    assert recorded["torch_tensorrt"] == "2.5.0" and recorded["torch"] == torch.__version__
    assert (first.engine_path / "compiled.pt2").is_file()
    with make_runner("torch_tensorrt", str(path), trust_programs=True, batch_sizes=(1,), engine_cache=str(tmp_path)) as again:
        np.testing.assert_allclose(again.infer(np.ones((1, 3, 16, 16), np.float32)), first_out, rtol=1e-5)
        assert again.torch_tensorrt["fallback_count"] == 1  # the report travels with the cached program
    assert not again.built_now and len(tt.calls) == 1
    # Another Torch-TensorRT release: another fingerprint, compiled again.
    newer = standin(monkeypatch, "2.14.0")
    with make_runner("torch_tensorrt", str(path), trust_programs=True, batch_sizes=(1,), engine_cache=str(tmp_path)) as other:
        pass
    assert other.built_now and len(newer.calls) == 1 and other.engine_path != first.engine_path


def test_an_int8_job_on_a_float_program_is_refused(monkeypatch, tmp_path, program):
    _, path = program
    standin(monkeypatch, "2.14.0")
    with pytest.raises(PrecisionMismatchError, match="no ModelOpt quantizer ops") as err:
        make_runner("torch_tensorrt", str(path), trust_programs=True, precision="int8", engine_cache=str(tmp_path)).load()
    assert "device checkpoint" in err.value.fix


# ------------------------------------------------------------------ per-layer timing
@pytest.mark.parametrize("version,trace,keys", [
    ("2.5.0", "_engine_exectuion_profile.trace", {"name", "ph", "ts", "dur", "tid", "pid", "args"}),
    ("2.9.0", "_engine_execution_profile.trace", {"name", "timeMs", "averageMs", "percentage"})])
def test_standin_engines_write_their_releases_trace(tmp_path, version, trace, keys):
    """The STAND-IN's engines: the trace file name and format of the release (TRTEngine.cpp, TRTEngineProfiler.cpp)."""
    from tests.device.torch_tensorrt_standin import make_torch_tensorrt
    from device.runners.torch_tensorrt_profile import find_engines

    tt = make_torch_tensorrt(version)
    path = tmp_path / "c.pt2"
    program = torch.export.export(tiny_model(), (torch.zeros(1, 3, 16, 16),))
    tt.save(tt.dynamo.compile(program, inputs=[tt.Input(shape=(1, 3, 16, 16))]), str(path),
            arg_inputs=[torch.zeros(1, 3, 16, 16)])
    module = tt.load(str(path)).module()
    [(name, engine), _] = find_engines(module)
    engine.profile_path_prefix = str(tmp_path)
    engine.enable_profiling()
    if version == "2.9.0":
        engine.set_profile_format("trex")
    else:
        assert not hasattr(engine, "set_profile_format")  # bound from 2.8 on
    module(torch.zeros(1, 3, 16, 16))
    module(torch.zeros(1, 3, 16, 16))
    events = json.loads((tmp_path / f"{engine.name}{trace}").read_text())
    assert name == f"{engine.name}_engine" and events and all(set(event) == keys for event in events)
    if version == "2.9.0":  # summed over both calls; the average is one call's
        assert all(event["timeMs"] == pytest.approx(2 * event["averageMs"]) for event in events)
    assert json.loads((tmp_path / f"{engine.name}_layer_information.json").read_text())["Layers"]


@pytest.mark.parametrize("version,fmt", [("2.5.0", "perfetto"), ("2.9.0", "trex"), ("2.14.0", "trex")])
def test_runner_times_each_engine_layer_with_its_releases_profiler(monkeypatch, tmp_path, program, version, fmt):
    """Against the STAND-IN: the runner's profile is the engines' own trace, read in the release's format."""
    from device.jobs.profile import profile_runner
    from device.runners.torch_tensorrt_profile import find_engines

    _, path = program
    standin(monkeypatch, version)
    with make_runner("torch_tensorrt", str(path), trust_programs=True, batch_sizes=(2,), engine_cache=str(tmp_path)) as runner:
        profile, note = profile_runner(runner, (2,), (3, 16, 16), iterations=4, warmup=1)
        engines = find_engines(runner._modules[2])
        assert all(engine._profile is None and engine.profile_path_prefix != "" for _, engine in engines)
    assert note is None and profile["runtime"] == "torch_tensorrt"
    assert f"Torch-TensorRT {version}" in profile["source"] and fmt in profile["source"]
    [table] = profile["batches"]
    names = {layer["name"] for layer in table["layers"]}
    # Two engines around the pool that fell back: their ATen ops, each under its engine's name; never the pool.
    assert {name.split("/")[0] for name in names} == {name for name, _ in engines} and len(engines) == 2
    assert any("conv" in name for name in names) and not any("adaptive" in name for name in names), names
    assert table["iterations"] == 4 and table["total_ms"] > 0
    assert sum(layer["share"] for layer in table["layers"]) == pytest.approx(1.0)
    assert any("fell back to PyTorch (aten.adaptive_avg_pool2d.default x1)" in n for n in profile["notes"])
    assert any("LAYER_NAMES_ONLY" in n for n in profile["notes"])


# The traces as core/runtime/TRTEngineProfiler.cpp's dump_trace writes them (its stream formatting, two layers run
# twice: 1.5 ms and 0.25 ms each time), and the inspector's LAYER_NAMES_ONLY JSON.
PERFETTO_2_5 = """[
  {
    "name": "conv1 + relu1",
    "ph": "X",
    "ts": 0,
    "dur": 3000,
    "tid": 1,
    "pid": "_run_on_acc_0 Engine Execution",
    "args": {}
  },
  {
    "name": "Reformatting CopyNode for Output Tensor 0 to conv1 + relu1",
    "ph": "X",
    "ts": 3000,
    "dur": 500,
    "tid": 1,
    "pid": "_run_on_acc_0 Engine Execution",
    "args": {}
  }
]
"""
TREX_2_9 = """[
  {
    "name": "conv1 + relu1",
    "timeMs": 3,
    "averageMs": 1.5,
    "percentage": 85.7143
  },
  {
    "name": "Reformatting CopyNode for Output Tensor 0 to conv1 + relu1",
    "timeMs": 0.5,
    "averageMs": 0.25,
    "percentage": 14.2857
  }
]
"""


@pytest.mark.parametrize("version,name,text", [("2.5.0", "_run_on_acc_0_engine_exectuion_profile.trace", PERFETTO_2_5),
                                               ("2.9.0", "_run_on_acc_0_engine_execution_profile.trace", TREX_2_9)])
def test_traces_in_torch_tensorrts_own_format_become_the_table(tmp_path, version, name, text):
    from device.jobs.profile import batch_profile
    from device.runners.torch_tensorrt_profile import read_engine_trace, tensorrt_timings

    spec = rules_for(version)["engine_profiler"].value
    (tmp_path / name).write_text(text)
    (tmp_path / "_run_on_acc_0_layer_information.json").write_text(
        json.dumps({"Layers": ["conv1 + relu1", "Reformatting CopyNode for Output Tensor 0 to conv1 + relu1"],
                    "Bindings": ["x", "out"]}))
    times, information = read_engine_trace(tmp_path, spec, iterations=2)
    table = batch_profile(1, 2, tensorrt_timings(information, times, "gpu"), "gpu")
    by_name = {layer.name: layer for layer in table.layers}
    assert by_name["conv1 + relu1"].time_ms == pytest.approx(1.5) and table.total_ms == pytest.approx(1.75)
    assert by_name["Reformatting CopyNode for Output Tensor 0 to conv1 + relu1"].overhead == "reformat"
    assert table.overhead_share == pytest.approx(0.25 / 1.75)


def test_a_missing_trace_is_an_error_naming_what_was_written(tmp_path):
    from device.errors import RunnerError
    from device.runners.torch_tensorrt_profile import read_engine_trace

    (tmp_path / "x_layer_information.json").write_text("{}")
    with pytest.raises(RunnerError, match=r"wrote no \*_engine_execution_profile.trace.*x_layer_information.json"):
        read_engine_trace(tmp_path, rules_for("2.14.0")["engine_profiler"].value, iterations=1)


def test_without_the_cpp_runtime_the_profile_says_so_instead_of_guessing(monkeypatch, tmp_path, program, capsys):
    """Against the STAND-IN of 2.14 without its C++ runtime: the Python engine prints, writes no trace."""
    from device.jobs.profile import profile_runner

    _, path = program
    standin(monkeypatch, "2.14.0", cpp_runtime=False)
    with make_runner("torch_tensorrt", str(path), trust_programs=True, batch_sizes=(1,), engine_cache=str(tmp_path)) as runner:
        profile, note = profile_runner(runner, (1,), (3, 16, 16), iterations=3, warmup=0)
    assert profile is None
    assert "without its C++ runtime" in note and "writes no trace" in note and "_TRTEngine.py@v2.13.0" in note


# ------------------------------------------------------------------ program versions
def rewrite_schema(source: Path, target: Path, major: int, torch_version: str) -> Path:
    """A copy of ``source`` whose archive claims another serialization schema and torch version."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            data = old.read(item.filename)
            if item.filename.endswith("models/model.json"):
                document = json.loads(data)
                document["schema_version"] = {"major": major, "minor": 0}
                document["torch_version"] = torch_version
                data = json.dumps(document).encode()
            elif item.filename.endswith("extra/edgefold.json"):
                data = json.dumps({"torch": torch_version}).encode()
            new.writestr(item, data)
    return target


def test_program_versions_are_read_without_torch(program):
    _, path = program
    versions = read_program_versions(path)
    from torch._export.serde.schema import SCHEMA_VERSION

    assert versions.torch == torch.__version__ and versions.schema == tuple(SCHEMA_VERSION)[:2]
    assert versions.quantized is False


def test_a_program_from_another_schema_major_is_refused_naming_both_versions(monkeypatch, tmp_path, program):
    """The closed schema refuses it first (it knows serialization schema 8 only), naming the writer's torch; the
    runner's own rule names both torch versions (test_version_rule_matches_torchs_own)."""
    from device.uploads.artifacts import UnsafeArtifactError

    _, path = program
    standin(monkeypatch, "2.5.0")
    foreign = rewrite_schema(path, tmp_path / "newer.pt2", 99, "2.99.0")
    with pytest.raises(UnsafeArtifactError) as err:
        make_runner("torch_tensorrt", str(foreign), trust_programs=True, engine_cache=str(tmp_path)).load()
    assert "written by torch 2.99.0 (serialization schema 99.0)" in err.value.message
    assert "device checkpoint" in err.value.fix


def test_version_rule_matches_torchs_own():
    # A JetPack 6 device (torch 2.5, schema 7.x) and a program from torch 2.14 (schema 8.20): refused.
    with pytest.raises(ProgramVersionError, match=r"torch 2\.14\.1.*torch 2\.5\.0"):
        check_program_versions(ProgramVersions((8, 20), "2.14.1", False), "2.5.0", (7, 3))
    # Same major, newer minor: torch's check passes; noted, not refused.
    notes = check_program_versions(ProgramVersions((8, 21), "2.15.0", False), "2.14.1", (8, 20))
    assert len(notes) == 1 and "2.15.0" in notes[0]
    assert check_program_versions(ProgramVersions((8, 2), "2.9.0", False), "2.14.1", (8, 20)) == []


def test_a_quantized_program_is_recognised_from_its_archive(tmp_path, program):
    _, path = program
    quantized = tmp_path / "q.pt2"
    with zipfile.ZipFile(path) as old, zipfile.ZipFile(quantized, "w") as new:
        for item in old.infolist():
            data = old.read(item.filename)
            if item.filename.endswith("models/model.json"):
                data = data.replace(b"aten.relu.default", b"tensorrt.quantize_op.default")
            new.writestr(item, data)
    assert read_program_versions(quantized).quantized is True


def test_not_a_program_is_a_device_error(tmp_path):
    from device.errors import DeviceError

    bogus = tmp_path / "x.pt2"
    bogus.write_bytes(b"not a zip")
    with pytest.raises(DeviceError, match="not a torch.export program"):
        read_program_versions(bogus)


# ------------------------------------------------------------------ through the real agent
@pytest.fixture(scope="module")
@slow_fixture
def agent_job(tmp_path_factory, program):
    from tests.device.torch_tensorrt_standin import sitecustomize_dir

    _, path = program
    tmp = tmp_path_factory.mktemp("ttagent")
    _, env = sitecustomize_dir(tmp / "site", "2.5.0")
    # A program is code: only an agent started with --trust-programs takes it (the default road is the device
    # checkpoint: tests/pipeline/test_torch_road.py).
    with AgentProcess(tmp / "data", env=env, args=("--trust-programs",)) as agent, agent.client() as client:
        sha = client.upload(path)
        job = client.submit({"artifact": sha, "runtime": "torch_tensorrt", "iterations": 5, "warmup_iterations": 1,
                             "idle_s": 0, "batch_sizes": [1, 2], "telemetry": ["host"], "label": "student"})
        return client.wait(job["id"], timeout_s=300)


def test_a_torch_tensorrt_job_runs_through_the_real_agent(agent_job):
    assert agent_job["state"] == "succeeded", agent_job["error"]
    result = agent_job["result"]
    runtime = result["runtime"]
    assert runtime["name"] == "torch_tensorrt" and runtime["precision"] == "fp32"
    assert runtime["torch_tensorrt"]["version"] == "2.5.0"
    assert runtime["torch_tensorrt"]["fallback_count"] == 1
    assert sorted(run["batch_size"] for run in result["runs"]) == [1, 2]
    assert all(run["latency_p50_ms"] > 0 for run in result["runs"])
    assert result["smoke"]["output_shape"] == [1, 5]
    # The per-layer profile, from the STAND-IN's 2.5 engine traces (perfetto), reaches the job's result.
    profile = result["profile"]
    assert profile is not None, runtime.get("profile_note")
    assert profile["runtime"] == "torch_tensorrt" and "perfetto" in profile["source"]
    assert [table["batch_size"] for table in profile["batches"]] == [1, 2]
    assert all(table["layers"] and table["total_ms"] > 0 for table in profile["batches"])


# ------------------------------------------------------------------ the real thing
@pytest.mark.tensorrt
@pytest.mark.gpu
def test_real_torch_tensorrt_compiles_and_matches_eager(tmp_path, program):
    pytest.importorskip("torch_tensorrt")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model, path = program
    with make_runner("torch_tensorrt", str(path), trust_programs=True, batch_sizes=(1, 4), engine_cache=str(tmp_path)) as runner:
        batch = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
        out = runner.infer(batch)
    with torch.inference_mode():
        eager = model(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(out, eager, rtol=1e-2, atol=1e-3)
    assert runner.torch_tensorrt["fallback"][4]["engines"] >= 1


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_real_torch_tensorrt_times_its_engine_layers(tmp_path, program):
    pytest.importorskip("torch_tensorrt")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from device.jobs.profile import profile_runner

    _, path = program
    with make_runner("torch_tensorrt", str(path), trust_programs=True, batch_sizes=(4,), engine_cache=str(tmp_path)) as runner:
        profile, note = profile_runner(runner, (4,), (3, 16, 16), iterations=5, warmup=1)
    import torch_tensorrt

    if not torch_tensorrt.ENABLED_FEATURES.torch_tensorrt_runtime:
        assert profile is None and "C++ runtime" in note
    else:
        assert profile is not None, note
        assert profile["batches"][0]["layers"] and profile["batches"][0]["total_ms"] > 0


# ------------------------------------------------------------------ both roads through the deploy stage and the report


@pytest.fixture(scope="module")
@slow_fixture
def two_roads(tmp_path_factory, program):
    """The deploy stage's jobs for one rung on both roads, against a real (default) agent whose job processes have
    the Torch-TensorRT stand-in; then the same against an agent without it. The Torch-TensorRT road sends the rung's
    device checkpoint (a tiny_resnet, rebuilt on the device)."""
    from pipeline.checkpoint import save_checkpoint
    from pipeline.deploy.devices import Device
    from pipeline.core.recipe import DeployConfig
    from pipeline.models import build_model
    from pipeline.tasks.classification.road_artifacts import RoadArtifacts, recorded_architecture
    from pipeline.tasks.classification.torch_export import write_device_checkpoint
    from tests.device.agent_process import tiny_onnx
    from tests.pipeline.test_deploy import deploy_one
    from tests.device.torch_tensorrt_standin import sitecustomize_dir

    tmp = tmp_path_factory.mktemp("roads")
    torch.manual_seed(0)
    student = save_checkpoint(tmp / "student.pt", build_model("tiny_resnet", 5).eval(), "tiny_resnet", 5)
    student_device = write_device_checkpoint(student, tmp / "student.device.pt", (3, 16, 16))
    models = {"student": tiny_onnx(tmp / "student.onnx", classes=5)}
    # retries=0: the INT8 rung fails on this CPU agent every time (no CUDA); a retry would only add a job.
    cfg = DeployConfig(rungs=["student"], batch_sizes=[1], duration_s=0.1, rounds=2, warmup_iterations=1, idle_s=0,
                       retries=0, job_timeout_s=600, runtimes=["tensorrt", "torch_tensorrt"])
    programs = {"student": RoadArtifacts(student_device, None, recorded_architecture(student_device))}
    if importlib.util.find_spec("modelopt") is not None:  # the INT8 rung: its device checkpoint, ModelOpt's state in it
        from pipeline.checkpoint import save_checkpoint
        from pipeline.models import build_model
        from pipeline.quantize.modelopt_state import calibrate

        checkpoint = save_checkpoint(tmp / "model.pt", build_model("tiny_resnet", 5).eval(), "tiny_resnet", 5)
        calibration = np.random.default_rng(0).standard_normal((16, 3, 16, 16)).astype(np.float32)
        calibrate(checkpoint, calibration, tmp / "student.int8.device.pt")
        programs["student_int8"] = RoadArtifacts(tmp / "student.int8.device.pt", None,
                                                 recorded_architecture(tmp / "student.int8.device.pt"))
    outcomes, logs = {}, {}
    for name, env in (("with", sitecustomize_dir(tmp / "site", "2.14.0")[1]), ("without", {})):
        (tmp / f"cache-{name}").mkdir()
        with AgentProcess(tmp / f"agent-{name}", env=env) as agent:
            device = Device(name, "edge", agent.url, "edge", str(agent.token_file))
            outcomes[name], logs[name] = deploy_one(device, models, cfg, tmp / f"cache-{name}", programs)
    return outcomes, logs


def test_deploy_runs_a_rung_on_both_roads_in_the_same_rounds(two_roads):
    outcomes, _ = two_roads
    outcome = outcomes["with"]
    assert outcome["rungs"]["student"]["state"] == "succeeded", outcome["rungs"]["student"].get("error")
    road = outcome["roads"]["torch_tensorrt"]
    assert road["status"] == "ok" and road["torch_tensorrt"] == "2.14.0"
    entry = road["rungs"]["student"]
    assert entry["state"] == "succeeded", entry.get("error")
    assert len(entry["rounds"]) == 2 and entry["spec"]["runtime"] == "torch_tensorrt"
    assert entry["result"]["runtime"]["torch_tensorrt"]["fallback_count"] == 1
    # Round 1 profiles (the deploy stage's rule): the STAND-IN's 2.14 engines write trex traces.
    assert "trex" in entry["rounds"][0]["profile"]["source"]


def test_the_int8_rung_is_sent_as_its_device_checkpoint_and_a_cpu_agent_says_why_it_cannot(two_roads):
    road = two_roads[0]["with"]["roads"]["torch_tensorrt"]
    if "student_int8" not in road["sent"]:
        pytest.skip("needs nvidia-modelopt to write the INT8 device checkpoint")
    assert road["sent"]["student_int8"].startswith("device checkpoint: the device rebuilds the module")
    assert road["sent"]["student"].startswith("device checkpoint")  # a default agent takes data only
    entry = road["rungs"]["student_int8"]
    # The agent stored the upload as a device checkpoint, restored ModelOpt's state, and refused to export on CPU.
    assert entry["state"] == "failed" and "needs CUDA tensors" in entry["error"]


def test_an_agent_without_torch_tensorrt_skips_that_road_and_says_why(two_roads):
    outcomes, logs = two_roads
    road = outcomes["without"]["roads"]["torch_tensorrt"]
    assert road["status"] == "not measured" and road["rungs"] == {}
    assert "no Torch-TensorRT" in road["reason"] and any("not measured" in line for line in logs["without"].lines)
    assert outcomes["without"]["rungs"]["student"]["state"] == "succeeded"  # the ONNX road is unaffected


def test_report_puts_the_two_roads_side_by_side(two_roads):
    import copy

    from device.schema import parse_result
    from pipeline.tasks.classification.headline import two_roads_text
    from pipeline.tasks.classification.report_data import _two_roads, _window_statistics

    device = copy.deepcopy(two_roads[0]["with"])
    onnx_entry = device["rungs"]["student"]
    onnx_rounds = [parse_result(r, "onnx") for r in onnx_entry["rounds"]]
    entry = device["roads"]["torch_tensorrt"]["rungs"]["student"]
    entry["result"] = parse_result(entry["result"], "torch")
    entry["rounds"] = [parse_result(r, "torch") for r in entry["rounds"]]
    row = {"device": "with", "rung": "student", "status": "measured", "latency_batch": 1, "throughput_batch": 1,
           "runtime": onnx_rounds[0].runtime.name, "device_top1": 0.9, **_window_statistics(onnx_rounds, 1, 1)}
    lines = {line["rung"]: line for line in _two_roads([row], device, None)}
    line = lines["student"]
    if "student_int8" in lines:  # a rung that failed on this road is said, with why, not dropped
        failed = two_roads_text(lines["student_int8"])
        assert "student_int8 on with, Torch-TensorRT 2.14.0: not measured: " in failed
        assert "needs CUDA tensors" in failed and "sent: device checkpoint" in failed
    expected = (np.median(_window_statistics(entry["rounds"], 1, 1)["latency_p50_windows_ms"])
                / np.median(row["latency_p50_windows_ms"]))
    assert line["latency_ratio"] == pytest.approx(expected)
    assert line["latency_low"] <= line["latency_ratio"] <= line["latency_high"]
    assert line["fallback_ops"] == {"aten.adaptive_avg_pool2d.default": 1} and line["fallback_count"] == 1
    # "Where the time goes" shows the Torch-TensorRT road's profile too, with what it leaves out.
    from pipeline.report.profile_report import time_section
    from pipeline.tasks.classification.report_data import layer_profiles
    from pipeline.report.sections import to_markdown_lines

    onnx_entry.update(result=onnx_rounds[0], rounds=onnx_rounds)
    profiles = [e for e in layer_profiles([device]) if e["runtime"] == "torch_tensorrt"]
    assert [(e["rung"], e["status"]) for e in profiles] == [("student", "measured")]
    page = "\n".join(to_markdown_lines(time_section({"layer_profiles": profiles})))
    assert "### student on with (torch_tensorrt, gpu, batch 1)" in page and "fell back to PyTorch" in page
    text = two_roads_text(line)
    assert ("Torch-TensorRT 2.14.0 (exported on the device from its checkpoint) vs ONNX → onnxruntime" in text
            and "1 op fell back to PyTorch" in text)
    assert "top-1 not measured vs 90.0%" in text


def test_the_gpus_pci_bus_id_falls_back_to_the_cuda_runtime_where_torch_lacks_the_fields(monkeypatch):
    """torch's own stubs do not list pci_domain_id/pci_bus_id/pci_device_id and an older Jetson wheel lacks them:
    the id then comes from cudaDeviceGetPCIBusId (a STAND-IN CUDA runtime here: no GPU)."""
    import types

    import device.runners.cuda
    from device.runners.torch_tensorrt import cuda_pci_bus_id

    def fake_torch(**fields):
        props = types.SimpleNamespace(name="Orin", **fields)
        return types.SimpleNamespace(cuda=types.SimpleNamespace(get_device_properties=lambda index: props))

    full = fake_torch(pci_domain_id=0, pci_bus_id=1, pci_device_id=0)
    assert cuda_pci_bus_id(full) == "00000000:01:00.0"

    class Runtime:
        def pci_bus_id(self, device=0):
            return "0000:00:00.0"

    monkeypatch.setattr(device.runners.cuda, "CudaRuntime", Runtime)
    assert cuda_pci_bus_id(fake_torch()) == "0000:00:00.0"

    class Missing:
        def __init__(self):
            raise OSError("libcudart.so: cannot open shared object file")

    monkeypatch.setattr(device.runners.cuda, "CudaRuntime", Missing)
    assert cuda_pci_bus_id(fake_torch()) is None

"""``edgefold ship``: the folder an application runs, checked the way an application would use it — ``infer.py`` run
on the test split's images, Triton's own schema parsing ``config.pbtxt``, the ``nvinfer`` keys NVIDIA documents, the
engine fetched from a real agent that built it (the TensorRT STAND-IN, tests/device/trt_standin.py: no TensorRT or
GPU here). The detection half is in tests/pipeline/test_detection_stages.py, on its run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from device.errors import ConfigError
from pipeline.tasks.classification.ship import ClassificationShip
from tests.slow import slow_fixture

pytest.importorskip("torch")
TASK_SHIP = ClassificationShip()


@pytest.fixture(scope="module")
def shipped(tiny_run, tmp_path_factory):
    """The tiny run's best rung shipped from its loopback measurements."""
    from pipeline.ship.bundle import ship

    folder = tmp_path_factory.mktemp("shipped") / "bundle"
    lines = []
    ship(tiny_run.run_dir, TASK_SHIP, to=folder, log=lines.append)
    return tiny_run.run_dir, folder, lines


def test_the_folder_holds_what_an_application_needs(shipped):
    run_dir, folder, lines = shipped
    for name in ("model.onnx", "labels.txt", "preprocess.json", "postprocess.json", "infer.py", "card.md",
                 "card.json", "deepstream/config_infer.txt", "deepstream/model.onnx", "deepstream/labels.txt"):
        assert (folder / name).is_file(), name
    card = json.loads((folder / "card.json").read_text())
    assert card["rung"] != "teacher" and "within 1 top-1 points of the teacher" in card["chosen"]
    assert lines[0].startswith(f"shipping {card['rung']}: ")
    # Either rule of best, as the loopback's intervals fall: the fastest clear of the rest, or the closest to the
    # teacher among those whose intervals overlap the fastest's.
    assert "the fastest rung on loopback" in lines[0] or "whose p50 intervals overlap the fastest's" in lines[0]
    preprocess = json.loads((folder / "preprocess.json").read_text())
    assert preprocess["kind"] == "resize_crop" and preprocess["input_name"] == "input" and preprocess["layout"] == "NCHW"
    assert (folder / "labels.txt").read_text().split() == [str(k) for k in range(10)]
    # Measured with ONNX Runtime on loopback: no engine, and the card says how to build one.
    assert not (folder / "engine").exists() and card["engine"]["trtexec"].startswith("trtexec --onnx=model.onnx")
    assert "No engine is shipped" in (folder / "card.md").read_text()
    assert not list(folder.parent.glob(".*partial*")), "nothing half-written is left"


def test_deepstream_gets_a_label_file_it_can_split_and_only_precisions_it_has(tiny_run, tmp_path):
    import dataclasses

    from pipeline.ship.bundle import ship

    class Named(ClassificationShip):
        def labels(self, run_dir):
            return [f"shirt; long sleeve {k}" for k in range(10)]

    folder = ship(tiny_run.run_dir, Named(), rung="student", to=tmp_path / "named", log=lambda _: None)
    assert (folder / "labels.txt").read_text().splitlines()[0] == "shirt; long sleeve 0", "infer.py's keep the ';'"
    ds_labels = (folder / "deepstream" / "labels.txt").read_text().strip().split(";")
    assert len(ds_labels) == 10 and ds_labels[0] == "shirt, long sleeve 0"
    card_text = (folder / "card.md").read_text()
    assert "a ';' in a class name is a ',' in deepstream/labels.txt" in card_text
    assert "as EdgeFold fed it on the same host" in card_text, "the nvinfer feed's score beside the host's own"

    class Fp8(ClassificationShip):
        def rows(self, run_dir):
            return [dataclasses.replace(r, precision="fp8") if r.rung == "student" else r
                    for r in super().rows(run_dir)]

    with pytest.raises(ConfigError, match="precision 'fp8', which nvinfer's network-mode has no value for"):
        ship(tiny_run.run_dir, Fp8(), rung="student", to=tmp_path / "fp8", log=lambda _: None)
    assert not (tmp_path / "fp8").exists() and not list(tmp_path.glob(".fp8*"))


def test_infer_py_gives_the_rungs_top1_on_the_test_split(shipped, tmp_path):
    from pipeline.tasks.classification.ship import ClassificationShip

    run_dir, folder, _ = shipped
    hooks = ClassificationShip()
    images = hooks.write_test_images(run_dir, tmp_path / "images")
    result = subprocess.run([sys.executable, str(folder / "infer.py"), str(tmp_path / "images"), "--json",
                             str(tmp_path / "answers.json")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    answers = json.loads((tmp_path / "answers.json").read_text())
    assert len(answers) == len(images)
    card = json.loads((folder / "card.json").read_text())
    assert hooks.score_answers(run_dir, answers) == pytest.approx(card["figures"]["accuracy"], abs=1e-9)


def test_config_pbtxt_parses_with_tritons_own_schema(shipped):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    _, folder, _ = shipped
    (model,) = [p for p in (folder / "triton").iterdir()]
    config = text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.name == model.name and config.platform == "onnxruntime_onnx" and config.max_batch_size >= 8
    assert config.input[0].name == "input" and list(config.input[0].dims) == [3, 16, 16]
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32 and list(config.output[0].dims) == [10]
    assert (model / "1" / "model.onnx").read_bytes() == (folder / "model.onnx").read_bytes()


def test_config_infer_holds_only_keys_nvidia_documents_each_with_a_value_it_takes(shipped):
    """The keys and values of Gst-nvinfer's "File Configuration Specifications" (DeepStream 9.2,
    https://docs.nvidia.com/metropolis/deepstream/dev-guide/text/DS_plugin_gst-nvinfer.html): pipeline/ship/
    deepstream.py:NVINFER_KEYS."""
    from pipeline.ship.deepstream import NVINFER_KEYS, parse_config

    _, folder, _ = shipped
    groups = parse_config((folder / "deepstream" / "config_infer.txt").read_text())
    assert list(groups) == ["property"]
    keys = groups["property"]
    for key, value in keys.items():
        assert key in NVINFER_KEYS and NVINFER_KEYS[key](value), (key, value)
    assert keys["network-type"] == "1" and keys["network-mode"] in ("0", "1", "2") and keys["infer-dims"] == "3;16;16"
    assert len(keys["offsets"].split(";")) == 3 and keys["onnx-file"] == "model.onnx"
    # nvinfer's classifier label file: the labels on one line, separated by semicolons.
    assert (folder / "deepstream" / "labels.txt").read_text().strip() == ";".join(str(k) for k in range(10))
    card = json.loads((folder / "card.json").read_text())
    assert card["deepstream"]["accuracy"] is not None and card["deepstream"]["images"] > 100


def test_triton_is_told_each_models_batch_and_type_or_refuses(tmp_path):
    """model_config.proto: with max_batch_size 0 the dims are the whole shape; a free batch axis lets Triton batch;
    bfloat16 is TYPE_BF16; a type Triton has no name for is refused, never declared as FP32."""
    import onnx
    from google.protobuf import text_format
    from onnx import TensorProto, helper
    from tritonclient.grpc import model_config_pb2

    from pipeline.ship.triton import io_facts, write_repository

    def graph(path, batch, elem=TensorProto.FLOAT):
        node = helper.make_node("Identity", ["x"], ["y"])
        made = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, [batch, 3, 4, 4])],
                                 [helper.make_tensor_value_info("y", elem, [batch, 3, 4, 4])])
        onnx.save(helper.make_model(made, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    def parsed(folder):
        return text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())

    static = graph(tmp_path / "static.onnx", 2)
    engine = tmp_path / "engine.plan"
    engine.write_bytes(b"plan")
    assert write_repository(tmp_path / "a", "m", static, engine, 4, 8) == ["m", "m_onnx"]
    plan, onnx_model = parsed(tmp_path / "a" / "m"), parsed(tmp_path / "a" / "m_onnx")
    assert plan.max_batch_size == 0 and list(plan.input[0].dims) == [2, 3, 4, 4]
    assert onnx_model.max_batch_size == 0 and list(onnx_model.output[0].dims) == [2, 3, 4, 4]
    assert onnx_model.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_AUTO
    free = graph(tmp_path / "free.onnx", "batch")
    write_repository(tmp_path / "b", "m", free, engine, 4, 8)
    plan, onnx_model = parsed(tmp_path / "b" / "m"), parsed(tmp_path / "b" / "m_onnx")
    assert plan.max_batch_size == 0 and list(plan.input[0].dims) == [4, 3, 4, 4], "the engine's one batch"
    assert onnx_model.max_batch_size == 8 and list(onnx_model.input[0].dims) == [3, 4, 4]
    bf16 = io_facts(graph(tmp_path / "bf16.onnx", 1, TensorProto.BFLOAT16))
    assert bf16["inputs"][0]["data_type"] == "TYPE_BF16"
    with pytest.raises(ValueError, match="FLOAT8E4M3FN, which Triton's model configuration has no type for"):
        io_facts(graph(tmp_path / "fp8.onnx", 1, TensorProto.FLOAT8E4M3FN))


def test_a_value_nvinfer_does_not_take_is_refused_when_written():
    from pipeline.ship.deepstream import config_text

    assert config_text({"network-mode": 2, "infer-dims": [3, 224, 224]}).startswith("[property]\nnetwork-mode=2")
    for keys in ({"network-mode": 7}, {"infer-dims": [224, 224]}, {"is-detector": 1}, {"offsets": "a;b"}):
        with pytest.raises(ValueError, match="not one the Gst-nvinfer page documents"):
            config_text(keys)


def test_the_deepstream_graph_takes_what_nvinfer_feeds_and_answers_probabilities(tmp_path):
    """A standard deviation per channel: nvinfer's one scale, the graph's per-channel Mul, and a Softmax after the
    logits give the probabilities of the original graph fed EdgeFold's way."""
    import onnxruntime as ort

    from pipeline.ship.deepstream import deepstream_model, normalization
    from tests.device.agent_process import tiny_onnx

    source = tiny_onnx(tmp_path / "m.onnx")
    preprocess = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    scale, offsets, per_channel = normalization(preprocess)
    assert per_channel is not None and scale == pytest.approx(1 / 255)
    changes = deepstream_model(source, tmp_path / "ds.onnx", per_channel, softmax=True)["changes"]
    assert len(changes) == 2
    pixels = np.random.default_rng(0).integers(0, 256, (4, 3, 16, 16)).astype(np.float32)
    mean = np.asarray(preprocess["mean"], np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(preprocess["std"], np.float32).reshape(1, 3, 1, 1)
    logits = ort.InferenceSession(str(source)).run(None, {"input": (pixels / 255 - mean) / std})[0]
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    fed = scale * (pixels - np.asarray(offsets, np.float32).reshape(1, 3, 1, 1))
    got = ort.InferenceSession(str(tmp_path / "ds.onnx")).run(None, {"input": fed.astype(np.float32)})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    # One standard deviation for all channels: the scale takes it, the graph is not touched before the network.
    scale, _, per_channel = normalization({"mean": [0.5] * 3, "std": [0.25] * 3})
    assert per_channel is None and scale == pytest.approx(1 / (255 * 0.25))


def test_bad_input_is_refused_with_the_fix_and_nothing_half_written(tiny_run, tmp_path, monkeypatch):
    from pipeline.ship import bundle

    run_dir = tiny_run.run_dir
    for kwargs, reason in (({"rung": "nosuch"}, "no rung 'nosuch' on loopback"),
                           ({"device": "orin"}, "did not measure on device 'orin'"),
                           ({"max_drop": -50.0}, r"--max-drop -50.0: the allowance is in accuracy points")):
        with pytest.raises(ConfigError, match=reason) as err:
            bundle.ship(run_dir, TASK_SHIP, to=tmp_path / "x", log=lambda _: None, **kwargs)
        assert err.value.fix
    (tmp_path / "exists").mkdir()
    with pytest.raises(ConfigError, match="exists") as err:
        bundle.ship(run_dir, TASK_SHIP, to=tmp_path / "exists", log=lambda _: None)
    assert "--to" in err.value.fix

    def broken(*args, **kwargs):
        raise RuntimeError("planted failure while writing")

    monkeypatch.setattr(bundle, "write_repository", broken)
    with pytest.raises(RuntimeError, match="planted failure"):
        bundle.ship(run_dir, TASK_SHIP, to=tmp_path / "half", log=lambda _: None)
    assert not (tmp_path / "half").exists() and not list(tmp_path.glob(".half*"))


def test_the_best_rule_picks_the_fastest_within_the_drop_and_names_the_closest():
    from pipeline.ship.choose import choose
    from pipeline.ship.task import ShipRow

    def row(rung, accuracy, p50):
        return ShipRow(rung, "orin", accuracy, "device", None, None, p50, 1, "int8", "tensorrt")

    rows = [row("teacher", 0.80, 5.0), row("student", 0.795, 2.0), row("student_int8", 0.78, 1.0),
            row("student_fp16", 0.794, 1.5)]
    chosen, why = choose(rows, "orin", "best", 1.0)
    assert chosen.rung == "student_fp16" and "faster but outside: student_int8" in why
    assert choose(rows, "orin", "best", 2.5)[0].rung == "student_int8"
    with pytest.raises(ConfigError, match="the closest is student at 0.50 points") as err:
        choose(rows, "orin", "best", 0.1)
    assert "--rung student" in err.value.fix
    # A rung the device could not score (host top-1 only) is not set against the device's teacher, and is named.
    host_only = ShipRow("pruned", "orin", 0.80, "host", None, None, 0.5, 1, "fp32", "tensorrt")
    chosen, why = choose([*rows, host_only], "orin", "best", 1.0)
    assert chosen.rung == "student_fp16" and "scored on the host while the teacher was scored on the device: pruned" \
        in why


# ------------------------------------------------------------------ the engine, from an agent that built it
@pytest.fixture(scope="module")
@slow_fixture
def measured_on_tensorrt(tiny_run, tmp_path_factory):
    """The tiny run deployed to a real agent whose job processes have the TensorRT STAND-IN (it builds an engine per
    batch into the agent's cache, as TensorRT would); the agent is kept running for the ship tests."""
    from pipeline.deploy.devices import Device
    from pipeline.runner import run_pipeline
    from tests.device.agent_process import AgentProcess
    from tests.device.clocked_runtime import sitecustomize_dir

    tmp = tmp_path_factory.mktemp("trt-ship")
    shutil.copytree(tiny_run.run_dir, tmp / "runs" / "tiny" / "shared")
    _, env = sitecustomize_dir(tmp / "site", None, "10.3.0")
    with AgentProcess(tmp / "agent", env=env) as agent:
        orin = Device("orin", "edge", agent.url, "edge", str(agent.token_file))
        ctx = run_pipeline("tiny", runs_dir=tmp / "runs", run_id="shared", devices=[orin],
                           overrides={"deploy.rounds": 1, "deploy.batch_sizes": [1], "deploy.duration_s": 0.05,
                                      "deploy.runtime": "tensorrt"})
        yield ctx.run_dir, agent, tmp


def test_the_engine_the_device_built_ships_with_its_build(measured_on_tensorrt):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from device.files import sha256_file
    from pipeline.ship.bundle import ship

    run_dir, agent, tmp = measured_on_tensorrt
    folder = ship(run_dir, TASK_SHIP, rung="student_int8", to=tmp / "int8", token=agent.token, log=lambda _: None)
    card = json.loads((folder / "card.json").read_text())
    engine = card["engine"]
    plan = folder / "engine" / "engine.plan"
    cached = agent.data_dir / "engines" / engine["key"] / "engine.plan"
    assert plan.read_bytes() == cached.read_bytes() and engine["sha256"] == sha256_file(plan)
    build = json.loads((folder / "engine" / "build.json").read_text())
    assert build["tensorrt"] == "10.3.0" and build["options"]["batch"] == [1, 1, 1]
    assert engine["fingerprint"]["gpu"] == "standin-gpu-0" and engine["fingerprint"]["tensorrt"] == "10.3.0"
    assert engine["trtexec"].startswith("trtexec --onnx=model.onnx --saveEngine=engine/engine.plan") and "--int8" in \
        engine["trtexec"]
    triton = folder / "triton" / f"tiny_student_int8"
    config = text_format.Parse((triton / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    # The engine is built for batch 1 alone: Triton is told its whole shape and to batch nothing itself.
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 0
    assert list(config.input[0].dims) == [1, 3, 16, 16] and list(config.output[0].dims) == [1, 10]
    assert (triton / "1" / "model.plan").read_bytes() == plan.read_bytes()
    # A classifier's DeepStream graph ends in a Softmax the measured engine lacks: nvinfer gets its own plan, built
    # with the measured engine's options from the DeepStream graph, never the measured plan under another graph.
    keys = (folder / "deepstream" / "config_infer.txt").read_text()
    assert "model-engine-file=model.plan" in keys and "../engine" not in keys and "network-mode=1" in keys
    card_text = (folder / "card.md").read_text()
    ds_line = card["deepstream"]["trtexec"]
    assert ds_line.startswith("trtexec --onnx=deepstream/model.onnx --saveEngine=deepstream/model.plan")
    assert ds_line.split()[3:] == engine["trtexec"].split()[3:] and ds_line in card_text
    assert "runs only on the device fingerprint" in card_text
    # The agent built and timed that graph as a form of the rung (deploy.nvinfer, in the same rounds): its plan ships
    # as deepstream/model.plan, the very bytes of the agent's cache entry, and the config names it.
    ds = card["deepstream"]
    form = json.loads((run_dir / "deploy" / "results.json").read_text())["devices"][0]["nvinfer"]["student_int8"]
    assert ds["plan"]["key"] not in (None, engine["key"]) and form["engines"]["1"] == ds["plan"]["key"]
    cached_form = agent.data_dir / "engines" / ds["plan"]["key"] / "engine.plan"
    assert (folder / "deepstream" / "model.plan").read_bytes() == cached_form.read_bytes()
    assert json.loads((folder / "deepstream" / "build.json").read_text())["sha256"] == sha256_file(cached_form)
    assert sha256_file(folder / "deepstream" / "model.onnx") == form["sha256"], "the graph that was timed"
    assert ds["form"]["vs_rung"]["rounds"] == 1 and ds["form"]["latency_p50_ms"] > 0
    assert "`nvinfer` runs `deepstream/model.plan`, the engine the agent built and timed" in card_text
    # The route is read-only and takes cache keys alone: an absent one is a 404 with the fix, a path is no key.
    import httpx

    auth = {"Authorization": f"Bearer {agent.token}"}
    absent = httpx.get(f"{agent.url}/v1/engines/{'0' * 16}-{'0' * 16}-{'0' * 8}", headers=auth)
    assert absent.status_code == 404 and "trtexec line" in absent.json()["fix"]
    for bad in ("..%2F..%2Fagent.db", engine["key"] + "x", "engine.plan"):
        assert httpx.get(f"{agent.url}/v1/engines/{bad}", headers=auth).status_code in (404, 422), bad
    assert httpx.put(f"{agent.url}/v1/engines/{engine['key']}/file", headers=auth, content=b"x").status_code == 405


def _shipped_infer(measured_on_tensorrt, name: str, monkeypatch):
    """The student shipped to its own folder and its infer.py imported as a user's script would be, with the
    TensorRT STAND-IN (tests/device/trt_standin.py) as ``tensorrt``."""
    import importlib.util

    from pipeline.ship.bundle import ship
    from tests.device import trt_standin

    run_dir, agent, tmp = measured_on_tensorrt
    folder = ship(run_dir, TASK_SHIP, rung="student", to=tmp / name, token=agent.token, log=lambda _: None)
    spec = importlib.util.spec_from_file_location(f"shipped_infer_{name}", folder / "infer.py")
    infer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(infer)
    monkeypatch.setitem(sys.modules, "tensorrt", trt_standin.make_tensorrt("10.3.0", 0))
    return folder, infer


def test_infer_py_runs_the_shipped_engine_where_tensorrt_is(measured_on_tensorrt, monkeypatch):
    """infer.py's TensorRT path against the STAND-IN (its engine file, TensorRT 10's tensor API, host memory for
    CUDA's): the same answers as ONNX Runtime on model.onnx."""
    from tests.device import trt_standin

    folder, infer = _shipped_infer(measured_on_tensorrt, "fp32", monkeypatch)
    cuda = trt_standin.FakeCuda()
    outputs = json.loads((folder / "postprocess.json").read_text())["outputs"]
    engine = infer.TensorRT(folder / "engine" / "engine.plan", outputs, cuda=cuda)
    reference = infer.OnnxRuntime(folder / "model.onnx", outputs)
    batch = np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32)
    assert engine.batch == 1 and engine.outputs == outputs == [o.name for o in reference.session.get_outputs()]
    allocated = dict(engine.devices)
    np.testing.assert_allclose(np.concatenate([engine(batch[i:i + 1])[0] for i in range(3)]), reference(batch)[0],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(engine(batch)[0], reference(batch)[0], rtol=1e-5, atol=1e-5)  # split into the 1s
    assert engine.devices == allocated and len(cuda.blocks) == len(allocated), "bound once, not per call"
    engine.close()
    assert sorted(cuda.freed) == sorted(allocated.values()) and not cuda.streams
    # bfloat16 has no NumPy type: it travels as its upper 16 bits, rounded to nearest even.
    values = np.array([1.0, -2.5, 3.1415927, 1e-3, 65504.0], np.float32)
    np.testing.assert_allclose(infer._from_bfloat16(infer._to_bfloat16(values)), values, rtol=2 ** -8)
    assert infer._to_bfloat16(np.array([1.0], np.float32))[0] == 0x3F80


def test_infer_py_falls_back_to_onnx_runtime_where_the_engine_cannot_run(measured_on_tensorrt, monkeypatch,
                                                                         capsys):
    """No CUDA runtime (OSError from ctypes) and an engine TensorRT refuses (RuntimeError): ONNX Runtime runs
    model.onnx, and says why."""
    folder, infer = _shipped_infer(measured_on_tensorrt, "fallback", monkeypatch)

    def no_cuda():
        raise OSError("libcudart.so: cannot open shared object file")

    monkeypatch.setattr(infer, "Cuda", no_cuda)
    assert isinstance(infer.load_runtime(False), infer.OnnxRuntime)
    assert "libcudart.so: cannot open shared object file" in capsys.readouterr().err
    (folder / "engine" / "engine.plan").write_bytes(b"not an engine")
    assert isinstance(infer.load_runtime(False), infer.OnnxRuntime)
    assert "could not deserialize" in capsys.readouterr().err


def test_an_engine_the_agent_no_longer_holds_and_a_device_that_is_gone(measured_on_tensorrt):
    from pipeline.ship.bundle import ship

    run_dir, agent, tmp = measured_on_tensorrt
    first = json.loads((ship(run_dir, TASK_SHIP, rung="teacher", to=tmp / "t1", token=agent.token,
                             log=lambda _: None) / "card.json").read_text())
    shutil.rmtree(agent.data_dir / "engines" / first["engine"]["key"])
    lines = []
    folder = ship(run_dir, TASK_SHIP, rung="teacher", to=tmp / "t2", token=agent.token, log=lines.append)
    card = json.loads((folder / "card.json").read_text())
    assert card["engine"]["file"] is None and "no longer holds it" in card["engine"]["why"]
    assert not (folder / "engine").exists() and any("no longer holds the engine" in line for line in lines)
    assert "Build it on the device" in (folder / "card.md").read_text()
    agent.stop()
    with pytest.raises(ConfigError, match=r"the device orin \(http.*\) does not answer for its engine") as err:
        ship(run_dir, TASK_SHIP, rung="teacher", to=tmp / "t3", token=agent.token, log=lambda _: None)
    assert "--no-engine" in err.value.fix and not (tmp / "t3").exists()
    folder = ship(run_dir, TASK_SHIP, rung="teacher", to=tmp / "t3", fetch_engine=False, log=lambda _: None)
    assert "shipped without it" in json.loads((folder / "card.json").read_text())["engine"]["why"]


def _infer_module(folder):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"shipped_infer_{abs(hash(str(folder)))}", folder / "infer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_bgr_model_ships_as_bgr_to_every_consumer(tiny_run, tmp_path):
    """A rung fed BGR (a model trained on OpenCV's order) used to ship as RGB: preprocess.json said RGB over the
    record, infer.py fed RGB and nvinfer was told model-color-format=0. Now each says BGR, and infer.py's input tensor
    for a colour image is the pipeline's (device/preprocess.py) bit for bit."""
    from device.preprocess import Preprocess
    from pipeline.ship.bundle import ship
    from pipeline.ship.deepstream import parse_config

    class Bgr(ClassificationShip):
        def preprocess(self, run_dir):
            return {**super().preprocess(run_dir), "channel_order": "bgr", "mean": [0.2, 0.3, 0.4],
                    "std": [0.3, 0.4, 0.5]}

    folder = ship(tiny_run.run_dir, Bgr(), rung="student", to=tmp_path / "bgr", log=lambda _: None)
    written = json.loads((folder / "preprocess.json").read_text())
    assert written["channel_order"] == "bgr"
    assert parse_config((folder / "deepstream" / "config_infer.txt").read_text())["property"]["model-color-format"] == "1"
    image = np.random.default_rng(0).integers(0, 256, (20, 24, 3), np.uint8)
    image[..., 0] = 255  # a red image: RGB and BGR inputs differ by far more than rounding
    infer = _infer_module(folder)
    fed, _ = infer.geometry(image, written)
    got = infer.normalize(fed[None], written)
    pipeline = Preprocess(written["input_size"], written["resize"], 3, tuple(written["mean"]), tuple(written["std"]),
                          written["interpolation"], channel_order="bgr")
    assert np.array_equal(got, pipeline.normalize(pipeline.geometry(image)[None]))
    as_rgb = Preprocess(written["input_size"], written["resize"], 3, tuple(written["mean"]), tuple(written["std"]),
                        written["interpolation"])
    assert np.abs(got - as_rgb.normalize(as_rgb.geometry(image)[None])).max() > 1.0


def test_infer_py_says_what_to_install_and_its_requirements_pin_the_lock(shipped, tmp_path):
    _, folder, _ = shipped
    required = (folder / "requirements.txt").read_text()
    assert "onnxruntime==" in required and "opencv-python-headless==" in required and "numpy==" in required
    fake = tmp_path / "no-ort" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('planted: no ONNX Runtime here')\n")
    image = tmp_path / "one.png"
    import cv2

    cv2.imwrite(str(image), np.zeros((16, 16, 3), np.uint8))
    result = subprocess.run([sys.executable, str(folder / "infer.py"), str(image), "--onnx"], capture_output=True,
                            text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fake.parent)})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "neither TensorRT nor ONNX Runtime is importable" in result.stderr
    assert f"pip install -r {folder / 'requirements.txt'}" in result.stderr


def test_ship_refuses_what_it_cannot_write_or_read_with_the_fix(tiny_run, tmp_path):
    from pipeline.ship import bundle

    run_dir = tiny_run.run_dir
    (tmp_path / "a-file").write_text("x")
    for to, said in ((Path("/proc/edgefold-x"), "cannot write there"), (tmp_path / "a-file" / "sub", "is a file")):
        with pytest.raises(ConfigError, match=said) as err:
            bundle.ship(run_dir, TASK_SHIP, to=to, log=lambda _: None)
        assert "TO=" in err.value.fix
    for drop in (-1.0, float("nan"), 101.0):
        with pytest.raises(ConfigError, match="from 0 to 100"):
            bundle.ship(run_dir, TASK_SHIP, max_drop=drop, to=tmp_path / "drop", log=lambda _: None)
    stopped = tmp_path / "runs" / "tiny" / "stopped"
    stopped.mkdir(parents=True)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["stages"] = {"data": manifest["stages"]["data"]}
    (stopped / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"stopped before deploy \(data ran\)") as err:
        bundle.ship(stopped, TASK_SHIP, to=tmp_path / "s", log=lambda _: None)
    assert "--run-id stopped" in err.value.fix
    assert not list(tmp_path.glob(".*partial*"))


def test_best_takes_the_faster_only_where_its_interval_clears_and_an_unfit_rung_needs_force():
    """student_fp16 2 µs faster than student, their p50 intervals overlapping: no measurable difference, so the one
    closer to the teacher ships, and the rule is said. A collapsed rung is never best and ships by name with --force."""
    import dataclasses

    from pipeline.ship.choose import choose
    from pipeline.ship.task import ShipRow

    def row(rung, accuracy, p50, low, high, verdict=None):
        return ShipRow(rung, "orin", accuracy, "device", None, None, p50, 1, "fp16", "tensorrt",
                       figures={"latency_p50_low_ms": low, "latency_p50_high_ms": high}, verdict=verdict)

    rows = [row("teacher", 0.80, 5.0, 4.9, 5.1), row("student", 0.798, 0.100, 0.097, 0.104),
            row("student_fp16", 0.795, 0.098, 0.095, 0.102), row("pruned", 0.80, 0.05, 0.049, 0.051, "collapsed: x")]
    chosen, why = choose(rows, "orin", "best", 1.0)
    assert chosen.rung == "student" and "whose p50 intervals overlap the fastest's" in why
    apart = [dataclasses.replace(r, figures={"latency_p50_low_ms": 0.050, "latency_p50_high_ms": 0.060})
             if r.rung == "student_fp16" else r for r in rows]
    chosen, why = choose(apart, "orin", "best", 1.0)
    assert chosen.rung == "student_fp16" and "its p50 interval clear of the next" in why
    with pytest.raises(ConfigError, match="pruned is not fit to ship: the report says collapsed") as err:
        choose(rows, "orin", "pruned")
    assert "--force" in err.value.fix
    chosen, why = choose(rows, "orin", "pruned", force=True)
    assert chosen.rung == "pruned" and "shipped with --force" in why


def test_the_card_carries_every_flag_the_report_did_and_the_precision_that_ran(tiny_run, tmp_path):
    from pipeline.ship.bundle import ship

    folder = ship(tiny_run.run_dir, TASK_SHIP, rung="student_int8", to=tmp_path / "int8", log=lambda _: None)
    card = json.loads((folder / "card.json").read_text())
    text = (folder / "card.md").read_text()
    assert any("ONNX Runtime ran instead of TensorRT" in flag for flag in card["flags"])
    assert any(flag.startswith("energy and power not measured: no power telemetry") for flag in card["flags"])
    assert "| energy per image | not measured | not measured |" in text, "a figure not measured is said, not dropped"
    assert card["precision_ran"].startswith("int8 in the graph, but no compute layer ran in INT8 on loopback")
    assert "int8 graph (no INT8 compute ran)" in text
    for flag in card["flags"]:
        assert f"- {flag}" in text


RECORD = {"input_size": 16, "resize": 18, "channels": 3, "mean": [0.3, 0.3, 0.3], "std": [0.38, 0.38, 0.38],
          "interpolation": "bilinear"}
VARIANTS = {"input_size": {"input_size": 24, "resize": 27}, "resize": {"resize": 32}, "interpolation=area":
            {"interpolation": "area"}, "interpolation=bicubic": {"interpolation": "bicubic"},
            "interpolation=bilinear_antialias": {"interpolation": "bilinear_antialias"},
            "interpolation=nearest": {"interpolation": "nearest"}, "mean": {"mean": [0.485, 0.456, 0.406]},
            "std": {"std": [0.229, 0.224, 0.225]}, "channels": {"channels": 1, "mean": [0.4], "std": [0.3]},
            "channel_order": {"channel_order": "bgr"}}


@pytest.mark.parametrize("key", list(VARIANTS))
def test_every_key_of_the_record_reaches_infer_py_and_nvinfer(key, tmp_path):
    """Each key of the run's preprocessing record set to a non-default value, through the bundle's preprocess.json:
    infer.py's input tensor equals the pipeline's (device/preprocess.py) bit for bit, and nvinfer's arithmetic
    (net-scale-factor × (x − offsets), the per-channel 1/std the DeepStream graph multiplies by) equals it within
    float error on the same pixels. So no key can be dropped on the way again."""
    from device.preprocess import Preprocess
    from pipeline.ship import bundle
    from pipeline.ship.deepstream import normalization

    recorded = {**RECORD, **VARIANTS[key]}
    written = bundle.shipped_preprocess({"kind": "resize_crop", **recorded}, "input")
    (tmp_path / "infer.py").write_text(bundle.INFER_SCRIPT.read_text())
    (tmp_path / "pil_resize.py").write_text(Path(bundle.pil_resize.__file__).read_text())  # shipped beside it
    infer = _infer_module(tmp_path)
    pipeline = Preprocess.from_dict(recorded)
    image = np.random.default_rng(1).integers(0, 256, (41, 53, 3), np.uint8)
    image[:, :, 0] = 250  # red: the channel order shows
    fed, _ = infer.geometry(image, written)
    expected = pipeline.normalize(pipeline.geometry(image)[None])
    assert np.array_equal(infer.normalize(fed[None], written), expected), key
    scale, offsets, per_channel = normalization(written)
    emulated = scale * (fed[None].astype(np.float32).transpose(0, 3, 1, 2) - np.asarray(offsets, np.float32)
                        .reshape(1, -1, 1, 1))
    if per_channel is not None:
        emulated = emulated * np.asarray(per_channel, np.float32).reshape(1, -1, 1, 1)
    assert np.allclose(emulated, expected, atol=1e-5), key


def test_ship_check_runs_the_folder_in_a_fresh_environment_and_equals_the_card(shipped, tmp_path):
    """edgefold ship --check as make ship runs it: a fresh virtual environment made from the folder's own
    requirements.txt (pip, from its cache or the index), infer.py run from another directory on the run's test split;
    its top-1 equals the card's, and the time per image against the agent's is written to the card."""
    from pipeline.ship.check import check

    run_dir, folder, _ = shipped
    copy = shutil.copytree(folder, tmp_path / "bundle")  # the check writes its record into the card
    lines = []
    record = check(copy, TASK_SHIP, "full", log=lines.append)
    card = json.loads((copy / "card.json").read_text())
    assert record["passed"] and record["python"] == "a fresh environment from requirements.txt"
    assert record["score"] == card["figures"]["accuracy"] and record["images"] == card["deepstream"]["images"]
    assert record["time_ratio"] > 0 and record["agent_ms_per_image"] == pytest.approx(card["figures"]["latency_p50_ms"])
    assert card["check"] == record and "## Checked (edgefold ship --check)" in (copy / "card.md").read_text()
    assert lines[0].startswith("check: a fresh environment from requirements.txt in ")
    assert lines[-1].startswith("check passed: ") and "equal to the device's score" in lines[-1]


def test_a_folder_that_does_not_run_as_measured_fails_its_check_with_both_scores(shipped, tmp_path, monkeypatch):
    """A preprocess.json edited after shipping (another mean): the check names the score infer.py got and the
    card's, records the failure in the card, and exits non-zero through the command line. auto leaves a check that
    would take over its budget to the user, naming the command."""
    import pipeline.ship.check as checking

    run_dir, folder, _ = shipped
    copy = shutil.copytree(folder, tmp_path / "bundle")
    pre = json.loads((copy / "preprocess.json").read_text())
    (copy / "preprocess.json").write_text(json.dumps({**pre, "mean": [0.9] * len(pre["mean"])}))
    with pytest.raises(checking.CheckFailed) as err:
        checking.check(copy, TASK_SHIP, python=sys.executable, log=lambda _: None)
    card = json.loads((copy / "card.json").read_text())
    assert not card["check"]["passed"] and card["check"]["score"] != card["figures"]["accuracy"]
    assert f"{100 * card['figures']['accuracy']:.4f}" in err.value.message and "report it" in err.value.fix
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "ship", str(copy), "--check", "--python",
                             sys.executable], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "infer.py scored top-1" in result.stderr

    fresh = shutil.copytree(folder, tmp_path / "auto")
    monkeypatch.setattr(checking, "AUTO_BUDGET_S", 0.0)
    lines = []
    assert checking.check(fresh, TASK_SHIP, "auto", python=sys.executable, log=lines.append) is None
    assert f"edgefold ship {fresh} --check" in lines[-1] and "check" not in json.loads((fresh / "card.json").read_text())
    (fresh / "card.json").write_text(json.dumps({**json.loads((fresh / "card.json").read_text()), "run": "/gone"}))
    with pytest.raises(ConfigError, match="is not there any more"):
        checking.check(fresh, TASK_SHIP, python=sys.executable)


def test_the_nvinfer_graph_is_measured_beside_each_rung_and_ships_as_measured(shipped):
    """deploy.nvinfer: every rung's nvinfer graph (its Softmax) is timed in the same rounds as the rung, right after
    it, so its ratio to the rung is paired by round; the bundle's DeepStream graph is that very file, and the card
    gives its time and, with no plan to ship (ONNX Runtime builds none), what nvinfer would build by itself."""
    from device.files import sha256_file

    run_dir, folder, _ = shipped
    deployed = json.loads((run_dir / "deploy" / "results.json").read_text())["devices"][0]
    rounds = json.loads((run_dir / "manifest.json").read_text())["stages"]["deploy"]["metrics"]["rounds"]
    assert set(deployed["nvinfer"]) == set(deployed["rungs"])
    for rung, form in deployed["nvinfer"].items():
        assert form["state"] == "succeeded" and form["vs_rung"]["rounds"] == rounds, rung
        assert form["sha256"] == sha256_file(run_dir / "deploy" / form["file"]) and "Softmax" in form["changes"][0]
        assert len(form["windows_ms"]) == len(form["rung_windows_ms"]) == rounds
    card = json.loads((folder / "card.json").read_text())
    assert sha256_file(folder / "deepstream" / "model.onnx") == deployed["nvinfer"][card["rung"]]["sha256"]
    assert card["deepstream"]["plan"] is None and card["deepstream"]["form"]["vs_rung"]["ratio"] > 0
    text = (folder / "card.md").read_text()
    assert "was measured on loopback as a form of this rung (onnxruntime, batch 1)" in text
    assert "`nvinfer` builds its own engine from `onnx-file` with its own options" in text


def test_the_deepstream_app_builds_nvidias_pipeline_and_reads_the_classifiers_probabilities(shipped, monkeypatch):
    """deepstream/app.py on the GStreamer/pyds STAND-IN (tests/pipeline/deepstream_standin.py): the pipeline of
    NVIDIA's samples, nvinfer on the shipped config, the probe on its src pad; fed the tensors nvinfer attaches (the
    DeepStream graph run on nvinfer's feed of test images), it reads the probabilities through their C buffer and
    answers the classes ONNX Runtime ranks first, named from labels.txt, drawn as display text."""
    import cv2
    import onnxruntime as ort

    from pipeline.ship.deepstream import normalization
    from tests.pipeline import deepstream_standin as standin

    run_dir, folder, _ = shipped
    pipeline, probe, kept = standin.built_app(folder, monkeypatch, "clip.mp4", 640, 480)
    assert pipeline.chain() == ["nvstreammux", "nvinfer", "nvvideoconvert", "nvdsosd", "nveglglessink"]
    infer = next(e for e in pipeline.elements if e.factory == "nvinfer")
    mux = next(e for e in pipeline.elements if e.factory == "nvstreammux")
    assert infer.properties["config-file-path"] == str(folder / "deepstream" / "config_infer.txt")
    assert (mux.properties["width"], mux.properties["height"], mux.properties["batch-size"]) == (640, 480, 1)
    assert infer.pads["src"].probes[0][1] is probe
    source = next(e for e in pipeline.elements if e.factory == "uridecodebin")
    assert source.properties["uri"].startswith("file:///") and "pad-added" in source.signals
    keys = (folder / "deepstream" / "config_infer.txt").read_text()
    assert "output-tensor-meta=1" in keys and "network-type=1" in keys

    session = ort.InferenceSession(str(folder / "deepstream" / "model.onnx"), providers=["CPUExecutionProvider"])
    images = TASK_SHIP._test(run_dir)[0][:6]
    pre = json.loads((folder / "preprocess.json").read_text())
    frames, expected = [], []
    scale, offsets, _ = normalization(pre)  # nvinfer's arithmetic; the graph holds any per-channel part
    for index, image in enumerate(images):
        stretched = cv2.resize(image, (pre["input_size"],) * 2, interpolation=cv2.INTER_LINEAR).astype(np.float32)
        stretched = np.repeat(stretched[..., None], pre["channels"], 2) if stretched.ndim == 2 else stretched
        fed = scale * (stretched.transpose(2, 0, 1)[None] - np.asarray(offsets, np.float32).reshape(1, -1, 1, 1))
        probabilities = session.run(None, {session.get_inputs()[0].name: fed.astype(np.float32)})[0][0]
        expected.append(int(probabilities.argmax()))
        name = session.get_outputs()[0].name
        frames.append(standin.frame(index, {name: probabilities.astype(np.float32)}))
    standin.run_probe(probe, frames)
    labels = (folder / "labels.txt").read_text().splitlines()
    assert [k["top"][0][0] for k in kept] == expected and [k["top"][0][1] for k in kept] == [labels[e] for e in expected]
    assert all(abs(sum(p for _, _, p in k["top"]) - 1) < 0.5 for k in kept), "probabilities, not logits"
    assert frames[0].displays[0].text_params[0].display_text.startswith(labels[expected[0]])


@pytest.mark.parametrize("style,channel_order,input_range", [("top_left", "rgb", "0-1"), ("ultralytics", "rgb", "0-1"),
                                                             ("ultralytics", "bgr", "0-1"),
                                                             ("ultralytics", "rgb", "0-255")])
def test_a_detectors_letterbox_and_feed_reach_infer_py_and_nvinfer(style, channel_order, input_range, tmp_path):
    """The per-key test's detection keys: EdgeFold's top-left letterbox and Ultralytics' centred one (a YOLO start),
    with the channel order and input range a start records. infer.py's tensor equals the data stage's letterbox fed
    as the device is fed (pipeline.tasks.detection.export.network_inputs) bit for bit, and nvinfer's arithmetic on the
    same pixels within float error."""
    from pipeline.ship import bundle
    from pipeline.ship.deepstream import normalization
    from pipeline.tasks.detection.data import letterbox
    from pipeline.tasks.detection.export import network_inputs

    recorded = {"kind": "letterbox_ultralytics" if style == "ultralytics" else "letterbox", "input_size": 32,
                "resize": 32, "channels": 3, "mean": [0.0] * 3, "std": [1 / 255 if input_range == "0-255" else 1.0] * 3,
                "interpolation": "bilinear", "channel_order": channel_order, "input_range": input_range}
    written = bundle.shipped_preprocess(recorded, "images")
    (tmp_path / "infer.py").write_text(bundle.INFER_SCRIPT.read_text())
    (tmp_path / "pil_resize.py").write_text(Path(bundle.pil_resize.__file__).read_text())
    infer = _infer_module(tmp_path)
    image = np.random.default_rng(2).integers(0, 256, (45, 70, 3), np.uint8)
    image[:, :, 0] = 250
    fed, _ = infer.geometry(image, written)
    expected = network_inputs(letterbox(image, 32, style)[0][None], 32, channel_order, input_range)
    assert np.array_equal(infer.normalize(fed[None], written), expected)
    scale, offsets, per_channel = normalization(written)
    assert per_channel is None
    emulated = scale * (fed[None].astype(np.float32).transpose(0, 3, 1, 2) - np.asarray(offsets, np.float32)
                        .reshape(1, -1, 1, 1))
    assert np.allclose(emulated, expected, atol=1e-5 * (255 if input_range == "0-255" else 1))

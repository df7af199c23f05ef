"""Uploaded files never run code on the device: crafted files of every kind the agent accepts, refused at upload
and, put into the store by other means, refused again when a job would load them. Each crafted payload runs
``touch MARKER`` if anything executes it; every test asserts the marker never appears. Real torch, ONNX and NumPy;
no stand-in.

A ``torch.export`` program is refused outright by a default agent (tests/device/test_program_trust.py); the program
tests here check what an agent started with ``--trust-programs`` still refuses (``trust=True``); the real agents, a
default one and a trusting one, with planted files, are there too."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from device.uploads.artifacts import ArtifactError, UnsafeArtifactError, check, verify
from device.files import sha256_file
from tests.device.agent_process import tiny_onnx

torch = pytest.importorskip("torch")


class Touch:
    """Pickles as a call of ``os.system("touch <marker>")``: what a crafted file smuggles in."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def upload_check(path: Path, trust: bool = True) -> str:
    """The agent's upload check; ``trust``: as an agent with ``--trust-programs`` makes it."""
    sha = sha256_file(path)
    return check(path, sha, sha, path.stat().st_size, trust)


def refused_at_upload(path: Path, reason: str, trust: bool = True) -> ArtifactError:
    with pytest.raises(ArtifactError, match=reason) as err:
        upload_check(path, trust)
    assert err.value.status == 422 and err.value.fix
    return err.value


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    """A two-layer convolutional program, saved by torch.export.save with a dynamic batch (shape expressions)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()
    exported = torch.export.export(model, (torch.zeros(2, 3, 8, 8),),
                                   dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
    path = tmp_path_factory.mktemp("program") / "model.pt2"
    torch.export.save(exported, path, extra_files={"edgefold.json": json.dumps({"torch": torch.__version__})})
    return path


def rewrite(source: Path, target: Path, replace: dict[str, bytes | None], compress: int = zipfile.ZIP_STORED) -> Path:
    """``source``'s entries into ``target`` with some replaced (None drops one), added, or renamed by the key."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", compression=compress) as new:
        root = old.namelist()[0].split("/")[0]
        for info in old.infolist():
            name = info.filename[len(root) + 1:]
            if name in replace:
                if replace[name] is not None:
                    new.writestr(info.filename, replace.pop(name))
                else:
                    replace.pop(name)
                continue
            new.writestr(info.filename, old.read(info))
        for name, data in replace.items():
            new.writestr(name if name.startswith(("/", "..")) else f"{root}/{name}", data)
    return target


def pickled(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def entry(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith(name)))


# -- torch.export programs -------------------------------------------------------------------------------------------

def test_a_program_as_torch_export_save_writes_it_passes_and_loads(program):
    from device.runners import make_runner

    assert upload_check(program) == "torch-export"
    with make_runner("torch", str(program), trust_programs=True) as runner:
        assert runner.infer(np.zeros((3, 3, 8, 8), np.float32)).shape == (3, 2)


@pytest.fixture
def crafted(program, tmp_path):
    """The program with its sample inputs replaced by a pickle that runs ``touch`` (the reported exploit)."""
    marker = tmp_path / "ran"
    path = rewrite(program, tmp_path / "crafted.pt2", {"data/sample_inputs/model.pt": pickled(Touch(marker))})
    return path, marker


def test_the_crafted_sample_inputs_run_code_through_plain_torch_export_load(crafted):
    """The exploit is real on this torch: without EdgeFold's walls, loading the file runs the command."""
    path, marker = crafted
    try:
        torch.export.load(str(path))
    except Exception:  # noqa: BLE001 (torch fails after the command ran: "'int' object is not subscriptable")
        pass
    assert marker.exists()


def test_the_crafted_program_is_refused_at_upload_and_never_loaded(crafted):
    path, marker = crafted
    err = refused_at_upload(path, r"sample_inputs/model\.pt: it names (posix|os)\.system")
    assert "torch.export.save" in err.fix
    with pytest.raises(UnsafeArtifactError, match="fails the torch-export check"):
        verify(path, "torch-export", True)
    assert not marker.exists()


@pytest.mark.parametrize("runtime", ["torch", "torch_tensorrt"])
def test_a_crafted_program_put_in_the_store_fails_its_runner_without_running(crafted, tmp_path, runtime):
    from device.runners import make_runner

    if runtime == "torch_tensorrt":
        pytest.importorskip("torch_tensorrt")
    path, marker = crafted
    stored = tmp_path / f"{sha256_file(path)}.pt2"
    stored.write_bytes(path.read_bytes())
    with pytest.raises(UnsafeArtifactError, match=r"(posix|os)\.system"):
        make_runner(runtime, str(stored), trust_programs=True).load()
    assert not marker.exists()


def test_the_unsafe_fallback_is_refused_even_when_the_check_is_skipped(crafted, monkeypatch):
    """The second wall alone: torch.export.load asks for weights_only=False and gets a weights-only load."""
    import device.runners.export_load as export_load

    path, marker = crafted
    real_load = torch.load
    monkeypatch.setattr(export_load, "verify", lambda *_: None)
    with pytest.raises(UnsafeArtifactError, match="fell back to an unrestricted torch.load .* refused"):
        export_load.load_program(torch, path)
    assert not marker.exists() and torch.load is real_load  # torch's loaders are put back


def test_pickled_weights_of_plain_tensors_still_load_weights_only(program, tmp_path, monkeypatch):
    """torch asks weights_only=False for pickled weights; forced to True, plain tensors load and the program runs."""
    import device.runners.export_load as export_load

    config = json.loads(entry(program, "model_weights_config.json"))
    name, meta = next(iter(config["config"].items()))
    meta["use_pickle"] = True
    weight = torch.frombuffer(bytearray(entry(program, f"weights/{meta['path_name']}")), dtype=torch.float32)
    weight = weight.reshape([s["as_int"] for s in meta["tensor_meta"]["sizes"]]).clone()
    path = rewrite(program, tmp_path / "pickled.pt2", {
        "data/weights/model_weights_config.json": json.dumps(config).encode(),
        f"data/weights/{meta['path_name']}": pickled(torch.nn.Parameter(weight))})
    assert upload_check(path) == "torch-export"
    loaded = export_load.load_program(torch, path, trust_programs=True)
    assert torch.equal(loaded.state_dict[name], weight)


@pytest.mark.parametrize("what,replace,reason", [
    ("a pickled weight that runs code", "weights", r"data/weights/weight_0: it names (posix|os)\.system"),
    ("an opaque object constant", "opaque", "opaque Python object constant"),
    ("a TorchScript custom object", "custom", "TorchScript custom-object constant"),
    ("a node calling torch.os.system", "target", r"operator 'torch\.os\.system'"),
    ("a shape expression that imports os", "expr", "shape expression .* holds"),
    ("a parameter name written into generated code", "param_name", "is not a module attribute path"),
    ("a pytree context that imports a module", "enum", "pytree context .* is not null or a list of plain keys"),
    ("a pytree type that is not a container", "pytree_type", "pytree node type 'collections.defaultdict'"),
    ("an argument name that is code", "arg_name", "is not a plain Python identifier"),
    ("a power sympy would compute for ever", "power", "a power whose exponent|powers of powers"),
    ("an expression that exhausts the parser", "deep", "is not a shape expression"),
    ("an ATen op that maps a file", "from_file", r"operator 'torch\.ops\.aten\.from_file\.default', which is not"),
    ("a path as a string argument", "string_arg", "string argument '/etc/passwd' is not an enum word"),
    ("a stride-0 weight a copy would make huge", "stride0", "weights are dense views of their own bytes"),
    ("an AOTInductor library", "aoti", "AOTInductor package"),
    ("an entry that climbs out", "dotdot", "leaves the archive"),
    ("an absolute entry", "absolute", "leaves the archive"),
    ("a zip bomb", "bomb", "zip bomb"),
    ("an unknown entry", "unknown", "torch.export.save does not write"),
])
def test_every_way_a_program_could_run_code_is_refused_at_upload(program, tmp_path, what, replace, reason):
    marker = tmp_path / "ran"
    document = json.loads(entry(program, "models/model.json"))
    changes: dict[str, bytes | None] = {}
    compress = zipfile.ZIP_STORED
    if replace == "weights":
        config = json.loads(entry(program, "model_weights_config.json"))
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        changes = {"data/weights/model_weights_config.json": json.dumps(config).encode(),
                   f"data/weights/{first['path_name']}": pickled(Touch(marker))}
    elif replace in ("opaque", "custom"):
        prefix = {"opaque": "opaque_obj", "custom": "custom_obj"}[replace]
        config = {"config": {"c": {"path_name": f"{prefix}0", "is_param": False, "use_pickle": True,
                                   "tensor_meta": None}}}
        changes = {"data/constants/model_constants_config.json": json.dumps(config).encode()}
        if replace == "opaque":  # the entry too, so the archive is what torch.export.save would write
            import pickle

            changes[f"data/constants/{prefix}0"] = pickle.dumps(Touch(marker))
    elif replace == "target":
        document["graph_module"]["graph"]["nodes"][0]["target"] = "torch.os.system"
        changes = {"models/model.json": json.dumps(document).encode()}
    elif replace == "expr":
        sizes = next(v["sizes"] for v in document["graph_module"]["graph"]["tensor_values"].values()
                     if any("as_expr" in size for size in v["sizes"]))
        sizes[0] = {"as_expr": {"expr_str": f"__import__('os').system('touch {marker}')", "hint": None}}
        changes = {"models/model.json": json.dumps(document).encode()}
    elif replace == "param_name":
        evil = '0.weight", __import__("os").system("touch ' + str(marker) + '") or "'
        spec = next(i for i in document["graph_module"]["signature"]["input_specs"] if "parameter" in i)
        config = json.loads(entry(program, "model_weights_config.json"))
        config["config"][evil] = config["config"].pop(spec["parameter"]["parameter_name"])
        spec["parameter"]["parameter_name"] = evil
        changes = {"models/model.json": json.dumps(document).encode(),
                   "data/weights/model_weights_config.json": json.dumps(config).encode()}
    elif replace in ("enum", "pytree_type", "arg_name"):
        signature = document["graph_module"]["module_call_graph"][0]["signature"]
        spec = json.loads(signature["in_spec"])
        if replace == "enum":
            spec[1]["context"] = json.dumps({"__enum__": True, "fqn": "this:d", "name": "x"})
        elif replace == "pytree_type":
            spec[1]["type"] = "collections.defaultdict"
        else:
            signature["forward_arg_names"] = ["x=__import__('os').system('true')"]
        signature["in_spec"] = json.dumps(spec)
        changes = {"models/model.json": json.dumps(document).encode()}
    elif replace in ("power", "deep"):
        sizes = next(v["sizes"] for v in document["graph_module"]["graph"]["tensor_values"].values()
                     if any("as_expr" in size for size in v["sizes"]))
        text = "s0 + 0*9**9**9**9" if replace == "power" else "-" * 9000 + "1"
        sizes[0] = {"as_expr": {"expr_str": text, "hint": None}}
        changes = {"models/model.json": json.dumps(document).encode()}
    elif replace in ("from_file", "string_arg"):
        node = document["graph_module"]["graph"]["nodes"][0]
        if replace == "from_file":
            node["target"] = "torch.ops.aten.from_file.default"
        node["inputs"].append({"name": "filename", "arg": {"as_string": "/etc/passwd"}, "kind": 1})
        changes = {"models/model.json": json.dumps(document).encode()}
    elif replace == "stride0":
        config = json.loads(entry(program, "model_weights_config.json"))
        meta = next(iter(config["config"].values()))["tensor_meta"]
        meta["sizes"] = [{"as_int": n} for n in (2, 3, 12000, 12000)]
        meta["strides"] = [{"as_int": 0}] * 4
        changes = {"data/weights/model_weights_config.json": json.dumps(config).encode()}
    elif replace == "aoti":
        changes = {"data/aotinductor/model/model.so": b"\x7fELF"}
    elif replace == "dotdot":
        changes = {"../evil.txt": b"x"}
    elif replace == "absolute":
        changes = {"/tmp/evil.txt": b"x"}
    elif replace == "bomb":
        changes = {"extra/padding.txt": b"\0" * (4 << 20)}
        compress = zipfile.ZIP_DEFLATED
    elif replace == "unknown":
        changes = {"code/model.py": b"import os"}
    path = rewrite(program, tmp_path / f"{replace}.pt2", changes, compress)
    refused_at_upload(path, reason)
    with pytest.raises(UnsafeArtifactError):
        verify(path, "torch-export", True)
    assert not marker.exists()


def test_the_shape_expression_check_passes_what_torch_writes_and_nothing_callable():
    from device.uploads.archive_check import ArchiveRefused, check_expression

    for text in ("Symbol('s77', positive=True, integer=True)", "2*s0 + 1", "Max(1, s0)", "FloorDiv(s0, 2)", "s0 <= 64",
                 "-s1 + 3.5"):
        check_expression(text, "x")
    for text in ("eval('1')", "s0.__class__", "open(s0)", "Symbol('__import__')", "[s0][0]", "lambda: 1",
                 "Symbol('s0', evaluate=exec)", "(1).real"):
        with pytest.raises(ArchiveRefused):
            check_expression(text, "x")


# -- device checkpoints ----------------------------------------------------------------------------------------------

def _checkpoint(tmp_path: Path, pickle_bytes: bytes, storages: dict[str, bytes] | None = None) -> Path:
    path = tmp_path / "crafted.device.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ckpt/data.pkl", pickle_bytes)
        archive.writestr("ckpt/version", b"3\n")
        for key, data in (storages or {}).items():
            archive.writestr(f"ckpt/data/{key}", data)
    return path


G_REBUILD = b"ctorch._utils\n_rebuild_tensor_v2\n"
STORAGE = b"(X\x07\x00\x00\x00storageq\x00ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ"
HOOKS = b"ccollections\nOrderedDict\n)R"


@pytest.mark.parametrize("what,body,reason", [
    ("hooks that are not empty", G_REBUILD + b"(" + STORAGE + b"K\x00K\x04\x85K\x01\x85\x89ccollections\nOrderedDict\n)R"
     b"K\x01X\x01\x00\x00\x00xstR.", "arguments that are not a tensor's"),
    ("a storage that is a string", G_REBUILD + b"(X\x01\x00\x00\x00xK\x00K\x04\x85K\x01\x85\x89" + HOOKS + b"tR.",
     "arguments that are not a tensor's"),
    ("a view past its storage", G_REBUILD + b"(" + STORAGE + b"K\x00K\x09\x85K\x01\x85\x89" + HOOKS + b"tR.",
     "reaches past or repeats its storage"),
    ("a stride-0 view that a copy makes huge", G_REBUILD + b"(" + STORAGE + b"K\x00M\x00\x10M\x00\x10\x86K\x00K\x00"
     b"\x86\x89" + HOOKS + b"tR.", "reaches past or repeats its storage"),
    ("state set on a tensor", G_REBUILD + b"(" + STORAGE + b"K\x00K\x04\x85K\x01\x85\x89" + HOOKS + b"tR}bh.",
     "BUILD"),
    ("a dtype called", b"ctorch\nfloat32\n)R.", "calls torch.float32"),
    ("a callable handed around in the memo", b"ctorch\nSize\nq\x00h\x00X\x02\x00\x00\x00osq\x01\x85R.",
     "torch.Size"),
    ("os.system by GLOBAL", b"cposix\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R.", r"names posix\.system"),
])
def test_a_checkpoint_pickle_is_run_on_symbols_and_refused(tmp_path, what, body, reason):
    path = _checkpoint(tmp_path, b"\x80\x02" + body, {"0": b"\0" * 16})
    refused_at_upload(path, reason)
    with pytest.raises(UnsafeArtifactError):
        verify(path, "torch-checkpoint")


def test_a_checkpoint_sets_only_the_widths_pruning_records(tmp_path):
    """Its structure may set a layer's recorded widths and nothing else (a padding of 50 would explode the compute),
    and its class count is bounded before anything is built."""
    from device.errors import CheckpointError
    from device.uploads.torch_checkpoint import load_checkpoint
    from pipeline.checkpoint import save_checkpoint
    from pipeline.models import build_model

    path = save_checkpoint(tmp_path / "model.pt", build_model("tiny_resnet", 5), "tiny_resnet", 5)
    assert load_checkpoint(path)[1]["num_classes"] == 5
    payload = torch.load(path, weights_only=True)
    for change, reason in ((lambda p: p["structure"]["stem.0"].update(padding=[50, 50]), "stem.0.padding"),
                           (lambda p: p["structure"]["fc"].update(out_features=1 << 30), "fc.out_features"),
                           (lambda p: p.update(num_classes=1 << 40), "classes")):
        edited = {**payload, "structure": {k: dict(v) for k, v in payload["structure"].items()}}
        change(edited)
        torch.save(edited, tmp_path / "edited.pt")
        with pytest.raises(CheckpointError, match=reason):
            load_checkpoint(tmp_path / "edited.pt")


def test_damaged_bytes_of_every_kind_are_refused_never_a_crash(program, tmp_path):
    """Bytes flipped anywhere in a program, a checkpoint, a set and a sidecar: each check passes or refuses with an
    ArtifactError (the agent's 422), never another exception (a 500)."""
    import random

    np.save(tmp_path / "set.npy", np.zeros((2, 3, 4, 4), np.float32))
    (tmp_path / "head.json").write_text('{"layout": [], "num_classes": 1e999}')
    torch.save({"w": torch.zeros(4)}, tmp_path / "ckpt.pt")
    rng = random.Random(0)
    outcomes = set()
    for source in (program, tmp_path / "set.npy", tmp_path / "head.json", tmp_path / "ckpt.pt"):
        data = source.read_bytes()
        for case in range(40):
            damaged = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                damaged[rng.randrange(4 if case % 2 else 0, len(damaged))] ^= 1 << rng.randrange(8)
            path = tmp_path / f"case{case}"
            path.write_bytes(bytes(damaged[: rng.randint(len(damaged) // 2, len(damaged))] if case % 5 == 0
                                   else damaged))
            try:
                outcomes.add(upload_check(path))
            except ArtifactError as err:
                outcomes.add(err.status)
    assert 422 in outcomes and outcomes <= {422, 400, "torch-export", "torch-checkpoint", "eval-set",
                                            "detection-head", "onnx"}


def test_a_real_checkpoint_passes_the_symbolic_run(tmp_path):
    from device.uploads.safe_pickle import Mapping, Tensor, check_torch_save

    state = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).state_dict()
    path = tmp_path / "real.device.pt"
    torch.save({"format": "edgefold.checkpoint/1", "state_dict": state, "input_chw": [3, 8, 8],
                "dtype": torch.float16, "size": torch.Size([1, 2]), "meta": {"top1": 0.5, "ok": True}}, path)
    assert upload_check(path) == "torch-checkpoint"
    with zipfile.ZipFile(path) as archive:
        value = check_torch_save(archive)
    state_dict = dict(value.items)["state_dict"]
    assert isinstance(state_dict, Mapping) and state_dict.ordered
    assert all(isinstance(tensor, Tensor) for _, tensor in state_dict.items)


# -- ONNX --------------------------------------------------------------------------------------------------------------

def _with_external(tmp_path: Path, location: str) -> Path:
    import onnx

    model = onnx.load(tiny_onnx(tmp_path / "tiny.onnx"))
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.ClearField("float_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "864")):
        weight.external_data.add(key=key, value=value)
    path = tmp_path / "external.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("location", ["/etc/hostname", "../../secret.bin", "weights.bin"])
def test_onnx_with_external_data_is_refused_wherever_it_points(tmp_path, location):
    path = _with_external(tmp_path, location)
    refused_at_upload(path, f"keeps its data outside the file \\(location '{location}'\\)")
    with pytest.raises(UnsafeArtifactError, match="outside the file"):
        verify(path, "onnx")


def test_onnx_external_data_inside_a_function_body_subgraph_is_found(tmp_path):
    """Function bodies' If/Loop subgraphs are walked too (external data or a custom domain could hide there)."""
    import onnx
    from onnx import TensorProto, helper

    leak = helper.make_tensor("leak", TensorProto.UINT8, [4], [0, 0, 0, 0])
    leak.ClearField("int32_data")
    leak.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "model.pt2"), ("offset", "0"), ("length", "4")):
        leak.external_data.add(key=key, value=value)
    branch = lambda name, value: helper.make_graph(  # noqa: E731
        [helper.make_node("Constant", [], [name], value=value)], name, [],
        [helper.make_tensor_value_info(name, TensorProto.UINT8, [4])])
    body = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("t", TensorProto.BOOL, [], [True])),
            helper.make_node("If", ["c"], ["y"], then_branch=branch("tv", leak),
                             else_branch=branch("ev", helper.make_tensor("z", TensorProto.UINT8, [4], [0] * 4)))]
    function = helper.make_function("local", "F", ["x"], ["y"], body, [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("F", ["X"], ["Y"], domain="local")], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("Y", TensorProto.UINT8, [4])])
    model = helper.make_model(graph, functions=[function],
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    path = tmp_path / "function.onnx"
    path.write_bytes(model.SerializeToString())
    (tmp_path / "model.pt2").write_bytes(b"PK\x03\x04")
    refused_at_upload(path, "tensor 'leak' keeps its data outside the file")


def test_onnx_with_a_custom_op_domain_is_refused(tmp_path):
    import onnx
    from onnx import helper

    model = onnx.load(tiny_onnx(tmp_path / "tiny.onnx"))
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    relu.op_type, relu.domain = "EvilRelu", "com.example.plugins"
    model.opset_import.append(helper.make_opsetid("com.example.plugins", 1))
    path = tmp_path / "custom.onnx"
    path.write_bytes(model.SerializeToString())
    refused_at_upload(path, "op 'EvilRelu' of domain 'com.example.plugins': a custom op")


def test_a_job_on_onnx_put_in_the_store_with_external_data_fails_before_loading(tmp_path):
    from device.jobs.jobrun import verify_stored

    path = _with_external(tmp_path, "/etc/hostname")
    stored = tmp_path / "0123.onnx"
    stored.write_bytes(path.read_bytes())
    with pytest.raises(UnsafeArtifactError, match="0123.onnx fails the onnx check"):
        verify_stored({"artifact_path": str(stored)})


def test_an_engine_is_never_accepted(tmp_path):
    """Engines are built on the device; bytes of a serialized plan (TensorRT's 'ftrt' magic) are refused."""
    path = tmp_path / "model.engine"
    path.write_bytes(b"ftrt" + bytes(range(256)) * 64)
    refused_at_upload(path, "not a valid ONNX model")


# -- evaluation sets and detection sidecars ---------------------------------------------------------------------------

def test_an_evaluation_set_with_objects_or_extra_bytes_is_refused(tmp_path):
    marker = tmp_path / "ran"
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([Touch(marker)], dtype=object), allow_pickle=True)
    refused_at_upload(objects, "float32 images .* got object")
    padded = tmp_path / "padded.npy"
    np.save(padded, np.zeros((2, 3, 4, 4), np.float32))
    with open(padded, "ab") as handle:
        handle.write(b"\x80\x02cposix\nsystem\n")
    refused_at_upload(padded, "header says .* but the file has")
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((2, 3, 4, 4), np.float32))
    assert upload_check(good) == "eval-set"
    with pytest.raises(UnsafeArtifactError):
        verify(objects, "eval-set")
    assert not marker.exists()


def test_an_image_set_is_uint8_rgb_and_never_taken_for_an_evaluation_set(tmp_path):
    good = tmp_path / "images.npy"
    np.save(good, np.zeros((3, 8, 8, 3), np.uint8))
    assert upload_check(good) == "image-set"
    verify(good, "image-set")
    with pytest.raises(UnsafeArtifactError, match="the file is an image-set, not an eval-set"):
        verify(good, "eval-set")  # stored under the other kind's name by other means: not loaded as one
    grey = tmp_path / "grey.npy"
    np.save(grey, np.zeros((3, 8, 8), np.uint8))
    refused_at_upload(grey, "an image set uint8 N×H×W×3")
    padded = tmp_path / "padded.npy"
    np.save(padded, np.zeros((3, 8, 8, 3), np.uint8))
    with open(padded, "ab") as handle:
        handle.write(b"\0")
    refused_at_upload(padded, "header says .* but the file has")


def test_an_evaluation_set_whose_shape_overflows_is_refused(tmp_path):
    path = tmp_path / "wrap.npy"
    header = {"descr": "<f4", "fortran_order": False, "shape": (2 ** 62 + 1, 4, 1, 1)}
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, header)
        handle.write(b"\0" * 16)  # numpy's int64 product of the shape wraps to 4 elements: 16 bytes
    refused_at_upload(path, "header says")


def test_a_detection_sidecar_with_values_of_the_wrong_kind_is_refused(tmp_path):
    for name, text in (("nan", '{"score_threshold": NaN}'), ("layout", '{"layout": []}'),
                       ("huge", '{"num_classes": 1e999}')):
        path = tmp_path / f"{name}.head.json"
        path.write_text(text)
        refused_at_upload(path, "not a detection sidecar")


def test_a_detection_sidecar_of_absurd_size_or_depth_is_refused(tmp_path):
    deep = tmp_path / "deep.head.json"
    deep.write_text('{"a": ' + "[" * 200_000 + "]" * 200_000 + "}")  # json.loads would exhaust the stack
    big = tmp_path / "big.head.json"
    big.write_text('{"pad": "' + "x" * (2 << 20) + '"}')
    for path, reason in ((deep, "nests deeper than 32"), (big, "over 1024 KiB")):
        refused_at_upload(path, reason)
        with pytest.raises(UnsafeArtifactError):
            verify(path, "detection-head")

"""The agent never turns an uploaded file into Python: a default agent refuses every ``torch.export`` program, and one
started with ``--trust-programs`` still checks each against the closed schema (device/uploads/program_schema.py).

Each crafted payload runs ``touch MARKER`` if anything executes it; every test asserts the marker never appears. The
three reported exploits (code in ``guards_code`` run at load and at every forward; a graph input named as a default
argument) are first shown to run with plain ``torch.export.load`` on this torch, so the payloads are real. Real torch,
a real agent on loopback; no stand-in.
"""

from __future__ import annotations

import copy
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from device.uploads.artifacts import ArtifactError, UnsafeArtifactError, check, verify
from device.files import sha256_file
from tests.device.agent_process import AgentProcess, plant
from tests.device.test_upload_safety import Touch, entry, pickled, program, rewrite  # noqa: F401 (the fixture)
from tests.slow import slow_fixture

torch = pytest.importorskip("torch")


def upload_check(path: Path, trust: bool) -> str:
    sha = sha256_file(path)
    return check(path, sha, sha, path.stat().st_size, trust)


def guards_at_load(marker: Path) -> str:
    return f'True #\n, "")\nimport os; os.system("touch {marker}")\ndef _z(*args):\n  torch._assert(True'


def guards_at_forward(marker: Path) -> str:
    return f'__import__("os").system("touch {marker}") == 0'


def placeholder(marker: Path) -> str:
    return f"x=__import__('os').system('touch {marker}')"


def rename_input(document: dict, new: str) -> dict:
    """The graph's user input renamed everywhere torch reads it (its argument, the signature, its tensor meta), with
    ``forward_arg_names`` left alone: the reported placeholder exploit."""
    document = copy.deepcopy(document)
    graph = document["graph_module"]["graph"]
    old = graph["inputs"][-1]["as_tensor"]["name"]

    def walk(value):
        if isinstance(value, dict):
            if set(value) == {"name"} and value["name"] == old:
                value["name"] = new
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(graph)
    walk(document["graph_module"]["signature"])
    graph["tensor_values"][new] = graph["tensor_values"].pop(old)
    return document


def exploits(program: Path, folder: Path, marker: Path) -> dict[str, Path]:
    """The three reported files and variants of each."""
    document = json.loads(entry(program, "models/model.json"))
    documents = {
        "guards_code run at load": {**document, "guards_code": [guards_at_load(marker)]},
        "guards_code run at every forward": {**document, "guards_code": [guards_at_forward(marker)]},
        "a graph input named as a default argument": rename_input(document, placeholder(marker)),
        # Variants: a harmless-looking guard, a guard among empty ones, a name that is a keyword, a dunder name, a node
        # output renamed the same way, a sym name.
        "a guard that is only True": {**document, "guards_code": ["True"]},
        "a guard after an empty one": {**document, "guards_code": ["", guards_at_forward(marker)]},
        "an input named lambda": rename_input(document, "lambda"),
        "an input named __import__": rename_input(document, "__import__"),
    }
    node_renamed = copy.deepcopy(document)
    node = node_renamed["graph_module"]["graph"]["nodes"][0]
    node["name"] = placeholder(marker)
    documents["a node named as code"] = node_renamed
    files = {}
    for index, (what, changed) in enumerate(documents.items()):
        files[what] = rewrite(program, folder / f"exploit{index}.pt2",
                              {"models/model.json": json.dumps(changed).encode()})
    # The first report: sample inputs pickled as a call of os.system.
    files["pickled sample inputs"] = rewrite(program, folder / "pickled.pt2",
                                             {"data/sample_inputs/model.pt": pickled(Touch(marker))})
    return files


@pytest.fixture
def crafted(program, tmp_path):  # noqa: F811
    marker = tmp_path / "ran"
    return exploits(program, tmp_path, marker), marker


@pytest.mark.parametrize("what", ["guards_code run at load", "guards_code run at every forward",
                                  "a graph input named as a default argument"])
def test_the_reported_files_run_code_through_plain_torch_export_load(crafted, what):
    """Without EdgeFold's walls, loading (and running) each reported file runs the command: the payloads are real."""
    files, marker = crafted
    try:
        module = torch.export.load(str(files[what])).module()
        module(torch.zeros(2, 3, 8, 8))
    except Exception:  # noqa: BLE001 (some fail after the command ran)
        pass
    assert marker.exists()


def test_every_crafted_file_is_refused_at_upload_with_and_without_trusted_programs(crafted):
    files, marker = crafted
    for what, path in files.items():
        with pytest.raises(ArtifactError, match=r"a torch\.export program \(\.pt2\) is refused") as default:
            upload_check(path, trust=False)
        assert default.value.status == 422 and "--trust-programs" in default.value.fix
        with pytest.raises(ArtifactError) as trusted:
            upload_check(path, trust=True)
        assert any(reason in trusted.value.message for reason in ("guards_code", "identifier", "system")), (
            what, trusted.value)
        for trust in (False, True):
            with pytest.raises(UnsafeArtifactError):
                verify(path, "torch-export", trust)
    assert not marker.exists()


@pytest.mark.parametrize("runtime", ["torch", "torch_tensorrt"])
def test_the_runners_refuse_a_program_unless_trusted_and_then_still_check_it(crafted, tmp_path, runtime,
                                                                            monkeypatch):
    from device.runners import make_runner
    from tests.device.test_torch_tensorrt import standin

    files, marker = crafted
    for path in files.values():
        stored = tmp_path / f"{sha256_file(path)}.pt2"
        stored.write_bytes(path.read_bytes())
        with pytest.raises(UnsafeArtifactError, match="was not loaded: a torch.export program"):
            make_runner(runtime, str(stored)).load()
        if runtime == "torch_tensorrt":
            standin(monkeypatch, "2.14.0")  # a STAND-IN for Torch-TensorRT: the check runs before it is used
        with pytest.raises(UnsafeArtifactError, match="fails the torch-export check"):
            make_runner(runtime, str(stored), trust_programs=True).load()
    assert not marker.exists()


def test_a_runner_fails_the_job_with_the_reason_when_torch_cannot_build_the_module(tmp_path):
    """What torch raises while it generates a module's source (a SyntaxError from a crafted name) is a RunnerError."""
    from device.errors import RunnerError
    from device.runners.export_load import program_module

    class Broken:
        def module(self):
            raise SyntaxError("invalid syntax (<eval_with_key>.0, line 4)")

    with pytest.raises(RunnerError, match="SyntaxError: invalid syntax") as err:
        program_module(Broken(), tmp_path / "x.pt2")
    assert ".device.pt" in err.value.fix


# -- the whole document, fuzzed ---------------------------------------------------------------------------------------

def code_values(marker: Path) -> list[str]:
    return [placeholder(marker), guards_at_load(marker), "a.b(c)", "x" * 5000, "ünïcödé_名前\u2028import os"]


def string_sites(document, path=()):
    """Every string of a JSON document (values and mapping keys), each once per structural path: list indices and the
    keys of name-keyed mappings collapse, so every field is tried without trying each of its thousand copies."""
    seen = set()

    def shape(where):
        return tuple("[]" if isinstance(step, int) else step for step in where)

    def walk(value, where):
        if isinstance(value, dict):
            for key, item in value.items():
                site = ("key", shape(where))
                if site not in seen:
                    seen.add(site)
                    yield "key", where, key
                walk_child = walk(item, (*where, key))
                yield from walk_child
        elif isinstance(value, list):
            for index, item in enumerate(value):
                yield from walk(item, (*where, index))
        elif isinstance(value, str):
            site = ("value", shape(where))
            if site not in seen:
                seen.add(site)
                yield "value", where, value

    yield from walk(document, path)


def dict_sites(document, where=()):
    if isinstance(document, dict):
        yield where
        for key, item in document.items():
            yield from dict_sites(item, (*where, key))
    elif isinstance(document, list):
        for index, item in enumerate(document):
            yield from dict_sites(item, (*where, index))


def replaced(document, kind: str, where: tuple, old: str, new: str):
    document = copy.deepcopy(document)
    parent = document
    for step in where[:-1] if kind == "value" else where:
        parent = parent[step]
    if kind == "value":
        parent[where[-1]] = new
    else:
        parent[new] = parent.pop(old)
    return document


def loads_without_running(path: Path, marker: Path) -> str:
    """Loads an accepted program through the trusting Torch runner and runs it; what happened, in words."""
    from device.errors import EdgeFoldError
    from device.runners import make_runner

    try:
        with make_runner("torch", str(path), trust_programs=True) as runner:
            runner.infer(np.zeros((2, 3, 8, 8), np.float32))
        outcome = "ran"
    except EdgeFoldError as err:
        outcome = f"failed: {err.message[:60]}"
    assert not marker.exists(), f"{path.name} ran code"
    return outcome


@pytest.fixture(scope="module")
def fuzzed(program, tmp_path_factory):  # noqa: F811
    """Every string field of a real torch.export.save document (models/model.json and the weights' configuration)
    replaced by each code-bearing value, and an unknown key added at every level: each refused at upload or, on an
    agent that trusts programs, loaded and run without creating the marker."""
    folder = tmp_path_factory.mktemp("fuzz")
    marker = folder / "ran"
    cases = []
    for entry_name, archive_name in (("models/model.json", "models/model.json"),
                                     ("model_weights_config.json", "data/weights/model_weights_config.json")):
        document = json.loads(entry(program, entry_name))
        for kind, where, old in string_sites(document):
            for number, value in enumerate(code_values(marker)):
                cases.append((f"{archive_name} {kind} {'/'.join(map(str, where))} value {number}", archive_name,
                              replaced(document, kind, where, old, value)))
        for where in dict_sites(document):
            changed = copy.deepcopy(document)
            target = changed
            for step in where:
                target = target[step]
            target["edgefold_unknown_key"] = "x"
            cases.append((f"{archive_name} unknown key at /{'/'.join(map(str, where))}", archive_name, changed))
    outcomes = {}
    for index, (what, archive_name, document) in enumerate(cases):
        path = rewrite(program, folder / f"case{index}.pt2", {archive_name: json.dumps(document).encode()})
        with pytest.raises(ArtifactError):
            upload_check(path, trust=False)
        try:
            upload_check(path, trust=True)
        except ArtifactError as err:
            assert err.status == 422, err
            outcomes[what] = "refused"
            continue
        outcomes[what] = f"accepted, {loads_without_running(path, marker)}"
    return outcomes, marker


def test_no_string_of_the_document_runs_code_and_unknown_keys_are_refused(fuzzed):
    outcomes, marker = fuzzed
    assert not marker.exists()
    assert len(outcomes) > 1000
    unknown = {what: outcome for what, outcome in outcomes.items() if "unknown key" in what}
    assert unknown and all(outcome == "refused" for outcome in unknown.values()), unknown
    # What the closed schema lets through is text torch only keeps as metadata (stack traces, module stacks): it was
    # loaded and run above, and nothing executed it.
    accepted = {what for what, outcome in outcomes.items() if outcome.startswith("accepted")}
    assert all("/metadata/" in what for what in accepted), sorted(accepted)[:5]
    for field in ("/name", "target", "expr_str", "parameter_name", "in_spec", "forward_arg_names",
                  "tensor_values", "path_name", "torch_version"):
        tried = [what for what in outcomes if field in what]
        assert tried and all(outcomes[what] == "refused" for what in tried), field


# -- the closed schema ------------------------------------------------------------------------------------------------

def test_the_schema_asset_covers_what_the_installed_torch_writes():
    """Every struct, field and type of this torch's own schema.yaml is in the asset (a torch upgrade that adds one
    fails here: regenerate with python -m tests.device.export_schema_source)."""
    from device.uploads.program_schema import schema
    from tests.device.export_schema_source import installed_schema_yaml, read_schema

    version, types = read_schema(installed_schema_yaml().read_text())
    asset = schema()
    assert version in asset["schema_versions"]
    for name, entry_ in types.items():
        known = asset["types"][name]
        if entry_["kind"] == "enum":
            assert entry_["values"].items() <= known["values"].items(), name
        else:
            for field, kinds in entry_["fields"].items():
                assert set(kinds) <= set(known["fields"][field]), f"{name}.{field}"


def test_every_string_the_schema_can_hold_has_a_grammar():
    from device.uploads.program_schema import STRING_ROLES, string_positions

    positions = string_positions()
    assert "ExportedProgram.guards_code" in positions and "TensorArgument.name" in positions
    assert positions <= set(STRING_ROLES), sorted(positions - set(STRING_ROLES))


def test_programs_of_real_architectures_pass_the_closed_schema(tmp_path):
    """The schema is closed, not narrow: programs torch writes for the registry's architectures pass."""
    from device.models.architectures import build_model
    from pipeline.tasks.classification.torch_export import export_program

    for arch in ("tiny_resnet", "mobilenet_v3_small", "regnet_y_400mf"):
        path = tmp_path / f"{arch}.pt2"
        export_program(build_model(arch, 4).eval(), path, (1, 3, 32, 32))
        assert upload_check(path, trust=True) == "torch-export"


def test_an_extra_entry_is_bounded_and_parsed_before_anything_reads_it(program, tmp_path):  # noqa: F811
    from device.errors import DeviceError
    from device.runners.torch_tensorrt import read_program_versions

    deep = rewrite(program, tmp_path / "deep.pt2", {"extra/edgefold.json": b"[" * 100_000 + b"]" * 100_000})
    big = rewrite(program, tmp_path / "big.pt2", {"extra/edgefold.json": b'"' + b"x" * (2 << 20) + b'"'})
    text = rewrite(program, tmp_path / "text.pt2", {"extra/notes.txt": b"not json"})
    for path, reason in ((deep, "nests deeper than 32"), (big, "over 1024 KiB"), (text, "not valid JSON")):
        with pytest.raises(ArtifactError, match=reason):
            upload_check(path, trust=True)
    for path in (deep, big):  # the runner's version read is bounded too (it ran before the re-check)
        with pytest.raises(DeviceError):
            read_program_versions(path)


def test_a_nul_in_an_entry_name_is_seen(program, tmp_path):  # noqa: F811
    """zipfile cuts a name at its NUL; the check reads the name as stored."""
    path = rewrite(program, tmp_path / "nul.pt2", {})
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        name = archive.namelist()[-1].encode()
    renamed = name[:-1] + b"\x00"
    data = data.replace(name, renamed)
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="leaves the archive"):
        upload_check(path, trust=True)


# -- through real agents: a default one and one that trusts programs --------------------------------------------------

@pytest.fixture(scope="module", params=["default", "trusted"])
@slow_fixture
def planted_agent(request, tmp_path_factory, program):  # noqa: F811
    """An agent whose store holds every crafted file, put there by hand before it started."""
    from device.service.store import Store

    root = tmp_path_factory.mktemp(f"planted-{request.param}")
    marker = root / "ran"
    files = exploits(program, root, marker)
    store = Store(root / "data")
    planted = {what: plant(store, path, "torch-export") for what, path in files.items()}
    args = ("--trust-programs",) if request.param == "trusted" else ()
    with AgentProcess(root / "data", args=args) as agent:
        yield agent, files, planted, marker, request.param


def test_crafted_files_are_refused_by_the_agent_and_planted_ones_fail_their_jobs(planted_agent):
    import httpx

    from tests.device.agent_process import TOKEN

    agent, files, planted, marker, trust = planted_agent
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with agent.client() as client:
        info = client.device()
        assert info["trust_programs"] is (trust == "trusted")
        assert "torchvision" in info["architectures"] and "entry_points" in info["architectures"]
        jobs = {}
        for what, sha in planted.items():
            again = rewrite(files[what], files[what].with_name("again.pt2"), {"extra/again.json": b"{}"})
            response = httpx.put(f"{agent.url}/v1/artifacts/{sha256_file(again)}", content=again.read_bytes(),
                                 headers=auth)
            assert response.status_code == 422, (what, response.text)
            for runtime in ("torch", "torch_tensorrt"):
                jobs[(what, runtime)] = client.submit(
                    {"artifact": sha, "runtime": runtime, "precision": "fp32", "batch_sizes": [1], "iterations": 2,
                     "warmup_iterations": 1, "idle_s": 0, "telemetry": ["host"]})["id"]
        for (what, runtime), job_id in jobs.items():
            done = client.wait(job_id, timeout_s=120)
            assert done["state"] == "failed", (what, runtime, done)
            if runtime == "torch" or trust == "default":
                expected = "was not loaded" if trust == "default" else "fails the torch-export check"
                assert expected in done["error"], (what, runtime, done["error"])
    assert not marker.exists()
    log = agent.log.read_text()
    assert ("programs: TRUSTED" in log) is (trust == "trusted") and "programs: " in log


# -- what an outside review found (tests/device: the review's reproductions) -----------------------------------------

def test_a_kwargs_key_written_into_forward_is_refused(program, tmp_path):  # noqa: F811
    """With ``forward_arg_names`` empty, torch 2.14 writes the keys of the in_spec's kwargs dict into ``def forward``
    (torch/export/_unlift.py _get_codegen): a key with a default value ran at ``.module()``."""
    marker = tmp_path / "ran"
    key = f'y=__import__("os").system("touch {marker}")#\'\n'
    leaf = {"type": None, "context": None, "children_spec": []}
    in_spec = json.dumps([1, {"type": "builtins.tuple", "context": "null", "children_spec": [
        {"type": "builtins.tuple", "context": "null", "children_spec": [leaf]},
        {"type": "builtins.dict", "context": json.dumps([key]), "children_spec": [leaf]}]}])
    document = json.loads(entry(program, "models/model.json"))
    signature = document["graph_module"]["module_call_graph"][0]["signature"]
    signature["in_spec"], signature["forward_arg_names"] = in_spec, []
    path = rewrite(program, tmp_path / "kwargs.pt2", {"models/model.json": json.dumps(document).encode()})
    with pytest.raises(ArtifactError, match="pytree context .* is not null or a list of plain keys"):
        upload_check(path, trust=True)
    assert not marker.exists()


def _split(data: bytes) -> tuple[bytes, bytes, int, int]:
    import struct

    end = data.rfind(b"PK\x05\x06")
    _, _, _, _, count, size, offset, _ = struct.unpack("<IHHHHIIH", data[end:end + 22])
    return data[:offset], data[offset:offset + size], count, size


def _shifted(directory: bytes, delta: int) -> bytes:
    import struct

    out, at = bytearray(directory), 0
    while at < len(out):
        name, extra, comment = struct.unpack("<HHH", out[at + 28:at + 34])
        offset = struct.unpack("<I", out[at + 42:at + 46])[0]
        out[at + 42:at + 46] = struct.pack("<I", offset + delta)
        at += 46 + name + extra + comment
    return bytes(out)


def two_faced(shown_to_torch: Path, shown_to_python: Path, target: Path) -> Path:
    """One file, two archives: Python's zipfile corrects every offset for the bytes before the directory it finds,
    torch's miniz reads the directory where the end record says; so each reads the entries of another archive."""
    import struct

    evil_entries, evil_directory, count, size = _split(shown_to_torch.read_bytes())
    benign_entries, benign_directory, other_count, other_size = _split(shown_to_python.read_bytes())
    assert (count, size) == (other_count, other_size), "the two archives must have directories of one size"
    evil_at = len(evil_entries) + len(benign_entries)
    base = evil_at + len(evil_directory)
    concat = base + len(benign_entries) - evil_at
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, size, evil_at, 0)
    target.write_bytes(evil_entries + b"\0" * len(benign_entries) + evil_directory + benign_entries
                       + _shifted(benign_directory, base - concat) + end)
    return target


def test_a_file_that_is_two_archives_is_refused(program, tmp_path):  # noqa: F811
    """The check would read a harmless program and torch a hostile one (guards_code) from the same bytes."""
    document = json.loads(entry(program, "models/model.json"))
    hostile = rewrite(program, tmp_path / "hostile.pt2", {"models/model.json": json.dumps(
        {**document, "guards_code": [guards_at_forward(tmp_path / "ran")]}).encode()})
    benign = rewrite(program, tmp_path / "benign.pt2", {"models/model.json": json.dumps(document).encode()})
    both = two_faced(hostile, benign, tmp_path / "both.pt2")
    with zipfile.ZipFile(both) as archive:
        seen = json.loads(archive.read(next(n for n in archive.namelist() if n.endswith("models/model.json"))))
    assert seen["guards_code"] == [], "Python's zipfile reads the harmless program"
    assert json.loads(torch._C.PyTorchFileReader(str(both)).get_record("models/model.json"))["guards_code"], \
        "torch reads the hostile one"
    with pytest.raises(ArtifactError, match="bytes before its entries or its directory is not where"):
        upload_check(both, trust=True)
    # The same shape of file as a device checkpoint: the pickle check would read the dense tensor, torch the view.
    for folder, tensor in (("view", torch.zeros(1).expand(1 << 20)), ("dense", torch.zeros(1))):
        (tmp_path / folder).mkdir()
        torch.save({"w": tensor}, tmp_path / folder / "w.pt")  # one name: one root folder, directories of one size
    checkpoint = two_faced(tmp_path / "view" / "w.pt", tmp_path / "dense" / "w.pt", tmp_path / "both.device.pt")
    with pytest.raises(ArtifactError, match="bytes before its entries"):
        upload_check(checkpoint, trust=False)


@pytest.mark.parametrize("expression", ["ceiling(1e99999999)", "(((((9**64)**64)**64)**64)**64)",
                                        "sqrt(Float(2, 100000000))", "Float(1, 999999999)", "Integer(1e99999999999)"])
def test_a_shape_expression_sympy_would_compute_for_ever_is_refused(program, tmp_path, expression):  # noqa: F811
    from device.uploads.archive_check import ArchiveRefused, check_expression

    with pytest.raises(ArchiveRefused):
        check_expression(expression, "x")


def test_an_unbacked_symbol_torch_would_count_to_for_ever_is_refused(program, tmp_path):  # noqa: F811
    document = json.loads(entry(program, "models/model.json"))
    document["range_constraints"]["u99999999999"] = {"min_val": 0, "max_val": 4}
    path = rewrite(program, tmp_path / "count.pt2", {"models/model.json": json.dumps(document).encode()})
    with pytest.raises(ArtifactError, match="u99999999999"):
        upload_check(path, trust=True)

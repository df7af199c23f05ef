"""Verifying artifacts: at upload, before they are stored, and again on the device just before a runner loads one.

An artifact is named by the sha256 of its bytes. The agent streams the upload into a temporary file through
:class:`HashingWriter` (a running hash and a size cap); only when the hash matches and the file is what it claims, and
holds nothing that would run code or read outside itself when loaded, is it moved into the store. Per kind:

* ``onnx``: a valid model whose tensors are all inside the file (external data would be read from the agent's own
  disk, wherever its location points) and whose nodes use only the standard and ONNX Runtime domains or the model's
  own functions (a custom-op domain makes a runtime look up code the model does not carry);
* ``torch-export`` (``.pt2``): refused unless the agent trusts programs (``--trust-programs``): loading one makes torch
  write Python from the file and run it. Trusted, it must still pass :func:`device.uploads.program_schema.check_program` (the
  closed schema of :mod:`device.uploads.program_schema`);
* ``torch-checkpoint`` (``.device.pt``): a bounded zip whose pickle :func:`device.uploads.safe_pickle.check_torch_save` passes;
* ``eval-set`` (``.npy``): float32 N×C×H×W in C order, no object dtype, its size exactly what the header says;
* ``image-set`` (``.images.npy``): the same, uint8 N×H×W×3 (raw RGB images a frame job makes its frames from);
* ``detection-head`` (``.head.json``): at most 1 MiB, nested at most 32 deep, a valid sidecar.

TensorRT engines are never accepted: they are built on the device from the ONNX, so an engine's bytes fail every
kind's check. :func:`verify` makes the same check before a runner loads a stored file, so a file put into the store by
other means fails its job with the reason and runs nothing.
"""

from __future__ import annotations

import hashlib
import math
import os
import zipfile
from pathlib import Path

from device.errors import MissingDependencyError, RunnerError, StatusError, require


DETECTION_POST = "device.scoring.detection_post"


class ArtifactError(StatusError):
    """An upload was refused; ``status`` is the HTTP status the agent answers with."""


class HashingWriter:
    """Writes chunks to ``path`` while hashing and counting them; refuses more than ``limit_bytes``."""

    def __init__(self, path: Path, limit_bytes: int):
        self.path, self.limit = path, limit_bytes
        self.digest = hashlib.sha256()
        self.size = 0
        self._file = open(path, "wb")

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise ArtifactError(f"upload exceeds the agent's limit of {self.limit >> 20} MiB",
                                fix="raise max_upload_mib in the agent's config", status=413)
        self.digest.update(chunk)
        self._file.write(chunk)

    def close(self) -> None:
        self._file.close()


PROGRAMS_REFUSED_FIX = (
    "send the rung's device checkpoint (<rung>.device.pt: state, architecture key and input C×H×W, which EdgeFold's "
    "export stage writes); the device rebuilds the module from its own architecture registry. Only if the module "
    "cannot be installed on the device: start the agent with --trust-programs, which lets any holder of its token "
    "run code on this board (device/README.md, Security)")


def programs_refused(prefix: str = "") -> str:
    """Why a ``torch.export`` program is refused on an agent that does not trust programs."""
    return (f"{prefix}a torch.export program (.pt2) is refused: this agent accepts data only (ONNX graphs, device "
            "checkpoints, tensors, JSON sidecars), and loading a program makes torch generate Python source from the "
            "file and run it")


def check(path: Path, expected_sha256: str, actual_sha256: str, size: int, trust_programs: bool = False) -> str:
    """The kind of a received file ("onnx", "torch-export", "torch-checkpoint", "eval-set", "image-set" or
    "detection-head") once its hash and content check out.

    Args:
        trust_programs: Accept ``torch.export`` programs (still checked against the closed schema); off by default.
    """
    if actual_sha256 != expected_sha256:
        raise ArtifactError(f"upload corrupted: its bytes hash to sha256 {actual_sha256}, not {expected_sha256}",
                            fix="upload again; the artifact is named by the sha256 of its exact bytes")
    if size == 0:
        raise ArtifactError("empty upload", fix="upload the model file's bytes as the request body", status=422)
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic == b"PK\x03\x04":
        return _checked(lambda: _zip_kind(path, trust_programs))
    if magic == b"\x93NUM":
        return _checked(lambda: _check_npy(path))
    if magic[:1] in (b"{", b"["):
        return _checked(lambda: _check_detection_head(path))
    return _checked(lambda: _check_onnx(path))


def _checked(check_kind) -> str:
    """Runs one kind's check; a file that makes the check itself fail (a damaged zip entry, a header numpy cannot
    tokenize, a document built to exhaust a parser) is refused with what failed, never answered with a 500."""
    try:
        return check_kind()
    except (ArtifactError, MissingDependencyError):
        raise
    except Exception as err:  # noqa: BLE001 (zipfile, numpy, onnx and json raise many types on crafted bytes)
        raise ArtifactError(f"the file could not be checked: {type(err).__name__}: {str(err)[:200]}",
                            fix="upload the file the pipeline wrote (it is damaged or crafted)", status=422) from None


MAX_HEAD_BYTES = 1 << 20
MAX_HEAD_DEPTH = 32
# Domains a runtime implements itself: ONNX's, ONNX-ML's and ONNX Runtime's contrib ops (compiled in, not looked up).
ONNX_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft"}
_KINDS = {}


def _kind(name: str):
    def register(check):
        _KINDS[name] = check
        return check
    return register


@_kind("detection-head")
def _check_detection_head(path: Path) -> str:
    """A detection sidecar (``.head.json``: anchors, box coder, thresholds) that decodes as the device will use it."""
    import importlib

    from device.uploads.archive_check import load_json
    from device.errors import ConfigError

    fix = "upload the .head.json the export stage wrote beside the ONNX"
    size = path.stat().st_size
    if size > MAX_HEAD_BYTES:
        raise ArtifactError(f"a detection sidecar of {size} bytes, over {MAX_HEAD_BYTES >> 10} KiB", fix=fix,
                            status=422)
    # Loaded by name, as device.jobs.jobrun loads the detection evaluation: a classification deploy's code hash (which
    # covers the agent) must not follow the detection decoder.
    decoder = importlib.import_module(DETECTION_POST)
    try:
        document = load_json(path.read_bytes(), "the sidecar", max_depth=MAX_HEAD_DEPTH, finite=True)
        if not isinstance(document, dict):
            raise ValueError(f"the sidecar is a JSON {type(document).__name__}, not an object")
        decoder.head_spec_from_dict(document, "the uploaded detection sidecar")
    except (ValueError, ConfigError, TypeError, AttributeError, OverflowError) as err:  # a value of the wrong kind
        raise ArtifactError(f"not a detection sidecar: {getattr(err, 'message', err)}", fix=fix, status=422) from None
    return "detection-head"


def _check_npy(path: Path) -> str:
    """An evaluation set (float32 images N×C×H×W, preprocessed) or an image set (uint8 N×H×W×3 RGB, as taken), by the
    ``.npy`` header's dtype: no pickled objects (the header only is read), C order, and exactly as many bytes as the
    header says."""
    import numpy as np

    fix = ("save the preprocessed test images with numpy.save(path, images.astype(np.float32)), or the raw ones "
           "with numpy.save(path, images.astype(np.uint8)) as N×H×W×3 RGB")
    try:
        with open(path, "rb") as handle:
            major, _ = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(handle)
            offset = handle.tell()
    except (ValueError, OSError, SyntaxError) as err:
        raise ArtifactError(f"not a readable .npy file: {err}", fix=fix, status=422) from None
    if dtype == np.uint8 and len(shape) == 4 and shape[3] == 3 and not fortran and shape[0] >= 1:
        kind = "image-set"
    elif dtype == np.float32 and len(shape) == 4 and not fortran and shape[0] >= 1:
        kind = "eval-set"
    else:
        raise ArtifactError(f"an evaluation set must be float32 images N×C×H×W, an image set uint8 N×H×W×3, both in C "
                            f"order; got {dtype} {shape}", fix=fix, status=422)
    expected = offset + math.prod(shape) * dtype.itemsize  # Python ints: numpy's product wraps at 2**63
    if path.stat().st_size != expected:
        raise ArtifactError(f"the .npy header says {shape} {dtype} ({expected} bytes with the header) but the file "
                            f"has {path.stat().st_size} bytes", fix=fix, status=422)
    return kind


def _npy_kind(kind: str):
    def check_kind(path: Path) -> str:
        found = _check_npy(path)
        if found != kind:
            raise ArtifactError(f"the file is an {found}, not an {kind}", fix="upload the file the deploy stage wrote", status=422)
        return found
    return check_kind


_KINDS["eval-set"], _KINDS["image-set"] = _npy_kind("eval-set"), _npy_kind("image-set")


def _sniff_zip(path: Path) -> str:
    """``torch-export`` or ``torch-checkpoint`` by what the zip holds (the agent then stores it under that suffix)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        raise ArtifactError(f"not a torch.export archive: {err}", status=422) from None
    if any(n.endswith("/archive_format") for n in names) or any("/models/" in n for n in names):
        return "torch-export"
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        return "torch-checkpoint"
    raise ArtifactError("a zip file, but neither a torch.export archive (no archive_format or models/) nor a "
                        "torch.save checkpoint (no data.pkl)",
                        fix="upload the .pt2 or the .device.pt the pipeline's export or quantize stage wrote",
                        status=422)


def _zip_kind(path: Path, trust_programs: bool) -> str:
    kind = _sniff_zip(path)
    if kind == "torch-export" and not trust_programs:
        raise ArtifactError(programs_refused(), fix=PROGRAMS_REFUSED_FIX, status=422)
    return _KINDS[kind](path)


@_kind("torch-export")
def _check_program(path: Path) -> str:
    """A ``torch.export`` program: :func:`device.uploads.program_schema.check_program`."""
    from device.uploads.archive_check import ArchiveRefused
    from device.uploads.program_schema import check_program

    try:
        check_program(path)
    except ArchiveRefused as err:
        raise ArtifactError(f"a torch.export program refused: {err}", fix=err.fix, status=422) from None
    except (RecursionError, MemoryError, UnicodeDecodeError) as err:  # a document built to exhaust the checker
        raise ArtifactError(f"a torch.export program refused: it could not be checked ({type(err).__name__})",
                            fix=ArchiveRefused("").fix, status=422) from None
    return "torch-export"


@_kind("torch-checkpoint")
def _check_checkpoint(path: Path) -> str:
    """An EdgeFold device checkpoint: a bounded ``torch.save`` archive whose pickle can only rebuild tensors and plain
    data (:func:`device.uploads.safe_pickle.check_torch_save`: no TorchScript entries, no compressed pickle, no call outside
    the tensor rules)."""
    from device.uploads.archive_check import ArchiveRefused, check_zip
    from device.uploads.safe_pickle import UnsafePickleError, check_torch_save

    fix = "upload the .device.pt the pipeline wrote (state and architecture key, never a pickled module)"
    try:
        with zipfile.ZipFile(path) as archive:
            check_zip(archive, "the checkpoint")
            check_torch_save(archive)
    except (UnsafePickleError, ArchiveRefused) as err:
        raise ArtifactError(f"a torch.save file refused: {err}", fix=fix, status=422) from None
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise ArtifactError(f"a damaged torch.save checkpoint: {type(err).__name__}: {err}", status=422) from None
    return "torch-checkpoint"


@_kind("onnx")
def _check_onnx(path: Path) -> str:
    onnx = require("onnx", "onnx", "pip install 'edgefold[device]'")
    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError, …
        model = err
    if not isinstance(model, Exception):
        _check_onnx_contents(onnx, model)  # first: onnx's checker would name an outside path less plainly
    try:
        if isinstance(model, Exception):
            raise model
        onnx.checker.check_model(model)
    except Exception as err:  # protobuf's DecodeError, onnx's ValidationError, …
        raise ArtifactError(f"not a valid ONNX model: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                            fix="upload the .onnx file the pipeline's export or quantize stage wrote", status=422) from None
    if not model.graph.input:
        raise ArtifactError("the ONNX model has no inputs", status=422)
    return "onnx"


def _onnx_graphs(onnx, model):
    """Every node list of the model, with its tensors: the main graph, every local function's body, and every subgraph
    (If/Loop/Scan) anywhere in either, however deep."""
    pending = [(model.graph.name, list(model.graph.node), list(model.graph.initializer),
                list(model.graph.sparse_initializer))]
    pending += [(f"function {f.domain}:{f.name}", list(f.node), [], []) for f in model.functions]
    while pending:
        where, nodes, initializers, sparse = pending.pop()
        yield where, nodes, initializers, sparse
        for node in nodes:
            for attr in node.attribute:
                for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    pending.append((f"{where} > {node.name or node.op_type}", list(graph.node),
                                    list(graph.initializer), list(graph.sparse_initializer)))


def _check_onnx_contents(onnx, model) -> None:
    """Refuses tensors stored outside the file and nodes of domains no runtime here implements."""
    local = {(f.domain, f.name) for f in model.functions}
    for where, nodes, initializers, sparse in _onnx_graphs(onnx, model):
        tensors = [*initializers, *(s.values for s in sparse), *(s.indices for s in sparse)]
        for node in nodes:
            for attr in node.attribute:
                tensors.extend([attr.t] if attr.type == onnx.AttributeProto.TENSOR else list(attr.tensors))
                if attr.type == onnx.AttributeProto.SPARSE_TENSOR:
                    tensors.extend([attr.sparse_tensor.values, attr.sparse_tensor.indices])
            if node.domain not in ONNX_DOMAINS and (node.domain, node.op_type) not in local:
                raise ArtifactError(
                    f"the ONNX model's node {node.name or node.op_type!r} ({where}) is op {node.op_type!r} of domain "
                    f"{node.domain!r}: a custom op the runtime would look up in code the model does not carry",
                    fix="export with standard ONNX ops only (TensorRT plugins and custom ops are not run on uploads)",
                    status=422)
        for tensor in tensors:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                location = next((e.value for e in tensor.external_data if e.key == "location"), "?")
                raise ArtifactError(
                    f"the ONNX model's tensor {tensor.name!r} keeps its data outside the file (location "
                    f"{location!r}): the agent stores one file per artifact and would read that path from its own disk",
                    fix="save the model with its weights inside: onnx.save_model(model, path, "
                        "save_as_external_data=False) (models under 2 GiB)", status=422)


class UnsafeArtifactError(RunnerError):
    """A stored artifact that fails its upload check when a job is about to load it."""


def verify(path: str | os.PathLike, kind: str, trust_programs: bool = False) -> None:
    """The upload check of ``kind``, made again on the stored file just before a runner loads it.

    Args:
        trust_programs: The agent's ``--trust-programs``: without it a ``torch-export`` file is refused unread.

    Raises:
        UnsafeArtifactError: The file fails it (named, with the check's reason); nothing of it was loaded.
    """
    if kind == "torch-export" and not trust_programs:
        raise UnsafeArtifactError(programs_refused(f"{Path(path).name} was not loaded: "), fix=PROGRAMS_REFUSED_FIX)
    try:
        _checked(lambda: _KINDS[kind](Path(path)))
    except ArtifactError as err:
        raise UnsafeArtifactError(f"{Path(path).name} fails the {kind} check and was not loaded: {err.message}",
                                  fix=err.fix or "upload the artifact again through the agent") from None

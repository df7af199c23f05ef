"""Verifying uploaded artifacts before they are stored: size, sha256, and that they are what they claim.

An artifact is named by the sha256 of its bytes. The agent streams the upload into a temporary file
through :class:`HashingWriter` (a running hash and a size cap); only when the hash matches and the file parses as an ONNX model (or a
``torch.export`` archive, or a device checkpoint of tensors only) is it moved into the store. Anything else is refused and deleted.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

from device.errors import StatusError, require


DETECTION_POST = "device.detection_post"


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


def check(path: Path, expected_sha256: str, actual_sha256: str, size: int) -> str:
    """The kind of a received file ("onnx", "torch-export", "torch-checkpoint", "eval-set" or "detection-head") once
    its hash and content check out."""
    if actual_sha256 != expected_sha256:
        raise ArtifactError(f"upload corrupted: its bytes hash to sha256 {actual_sha256}, not {expected_sha256}",
                            fix="upload again; the artifact is named by the sha256 of its exact bytes")
    if size == 0:
        raise ArtifactError("empty upload", fix="upload the model file's bytes as the request body", status=422)
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic == b"PK\x03\x04":
        return _check_torch_archive(path)
    if magic == b"\x93NUM":
        return _check_eval_set(path)
    if magic[:1] == b"{":
        return _check_detection_head(path)
    return _check_onnx(path)


def _check_detection_head(path: Path) -> str:
    """A detection sidecar (``.head.json``: anchors, box coder, thresholds) that decodes as the device will use it."""
    import importlib
    import json

    from device.errors import ConfigError

    # Loaded by name, as device.jobrun loads the detection evaluation: a classification deploy's code hash (which
    # covers the agent) must not follow the detection decoder.
    decoder = importlib.import_module(DETECTION_POST)
    try:
        decoder.head_spec_from_dict(json.loads(path.read_text()), "the uploaded detection sidecar")
    except (ValueError, ConfigError) as err:  # JSONDecodeError is a ValueError; HeadSpecError a ConfigError
        raise ArtifactError(f"not a detection sidecar: {getattr(err, 'message', err)}",
                            fix="upload the .head.json the export stage wrote beside the ONNX", status=422) from None
    return "detection-head"


def _check_eval_set(path: Path) -> str:
    """An evaluation set: a ``.npy`` of float32 images, N×C×H×W, no pickled objects (its header only is read)."""
    import numpy as np

    try:
        with open(path, "rb") as handle:
            major, _ = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(handle)
    except (ValueError, OSError) as err:
        raise ArtifactError(f"not a readable .npy file: {err}", status=422) from None
    if dtype != np.float32 or len(shape) != 4 or fortran or shape[0] < 1:
        raise ArtifactError(f"an evaluation set must be float32 images N×C×H×W in C order, got {dtype} {shape}",
                            fix="save the preprocessed test images with numpy.save(path, images.astype(np.float32))",
                            status=422)
    return "eval-set"


def _check_torch_archive(path: Path) -> str:
    """A ``torch.export`` program, or an EdgeFold device checkpoint: a ``torch.save`` archive whose pickle, read
    without torch, names only tensor, dtype and OrderedDict globals (:func:`device.torch_checkpoint.pickle_globals`:
    no TorchScript entries, no compressed pickle, no opcode that calls anything else)."""
    try:
        names = zipfile.ZipFile(path).namelist()
    except zipfile.BadZipFile as err:
        raise ArtifactError(f"not a torch.export archive: {err}", status=422) from None
    if any(n.endswith("/archive_format") for n in names) and any("/models/" in n for n in names):
        return "torch-export"
    if not any(n.endswith("/data.pkl") for n in names):
        raise ArtifactError("a zip file, but neither a torch.export archive (no archive_format or models/) nor a "
                            "torch.save checkpoint (no data.pkl)",
                            fix="upload the .pt2 or the .device.pt the pipeline's export or quantize stage wrote",
                            status=422)
    from device.torch_checkpoint import UnsafeArchiveError, pickle_globals, unsafe_globals

    fix = "upload the .device.pt the pipeline wrote (state and architecture key, never a pickled module)"
    try:
        unsafe = unsafe_globals(pickle_globals(path))
    except UnsafeArchiveError as err:
        raise ArtifactError(f"a torch.save file refused: {err}", fix=fix, status=422) from None
    except Exception as err:  # noqa: BLE001 (pickletools and zipfile raise several types on damaged bytes)
        raise ArtifactError(f"a damaged torch.save checkpoint: {type(err).__name__}: {err}", status=422) from None
    if unsafe:
        raise ArtifactError(f"a torch.save file that pickles Python objects, not only tensors ({', '.join(unsafe[:3])})"
                            ": loading it would run code", fix=fix, status=422)
    return "torch-checkpoint"


def _check_onnx(path: Path) -> str:
    onnx = require("onnx", "onnx", "pip install 'edgefold[device]'")
    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
        onnx.checker.check_model(model)
    except Exception as err:  # protobuf's DecodeError, onnx's ValidationError, …
        raise ArtifactError(f"not a valid ONNX model: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                            fix="upload the .onnx file the pipeline's export or quantize stage wrote", status=422) from None
    if not model.graph.input:
        raise ArtifactError("the ONNX model has no inputs", status=422)
    return "onnx"

"""The module a torch runner runs: rebuilt from a device checkpoint by default, loaded from a program only when the
agent trusts programs. Both torch runners (``torch``, ``torch_tensorrt``) load through here.

A **device checkpoint** (``.device.pt``: state, architecture key and its recorded source, input C×H×W) is data: the
module is built by this device's own code (:mod:`device.models.architectures`: the built-ins, timm where installed, entry
points installed on the device) and the state is loaded with ``torch.load(weights_only=True)`` after the upload's
pickle check (:func:`device.uploads.torch_checkpoint.load_for_export`).

A **torch.export program** (``.pt2``) is code: ``torch.export.load`` and ``ExportedProgram.module()`` write Python from
the file and ``exec`` it. It is refused unless the agent runs with ``--trust-programs``; even then three walls stand:

1. the upload check (:func:`device.uploads.program_schema.check_program`: the archive's entries and pickles and the closed schema,
   tensor-only pickles), made again on the stored file first;
2. while torch loads, every ``torch.load`` runs with ``weights_only=True`` whatever the caller asked, and the two raw
   unpicklers refuse to run at all. A file that needed the unsafe path fails with the reason instead of being loaded
   the unsafe way;
3. whatever torch raises while it deserializes or generates the module (``SyntaxError`` included) fails the job with
   the reason.

torch is imported by the caller; this module imports nothing heavy.
"""

from __future__ import annotations

import os
import re
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from device.uploads.artifacts import UnsafeArtifactError, verify
from device.errors import CheckpointError, DeviceError, EdgeFoldError, RunnerError


class _Refused(Exception):
    pass


def artifact_kind(path: str | os.PathLike) -> str:
    """``torch-export`` (a ``.pt2``) or ``torch-checkpoint`` (a ``.device.pt``).

    The agent stores each upload under the suffix of the kind its check found (:data:`device.service.store.ARTIFACT_SUFFIX`),
    so the suffix decides: a file the check passed as a program is never unpickled as a checkpoint. A path with
    neither suffix (the runner used directly) is read: ``models/*.json`` makes a program, ``data.pkl`` a checkpoint.
    """
    name = os.fspath(path)
    if name.endswith(".device.pt"):
        return "torch-checkpoint"
    if name.endswith(".pt2"):
        return "torch-export"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        raise DeviceError(f"{path} is neither a torch.export program nor a device checkpoint (not a zip archive)",
                          fix="send the .device.pt the pipeline wrote") from None
    if any(re.search(r"(^|/)models/[^/]+\.json$", n) for n in names):
        return "torch-export"
    return "torch-checkpoint" if any(n.endswith("data.pkl") for n in names) else "torch-export"


@contextmanager
def _weights_only(torch):
    """Patches torch's loaders for the duration of one load (the job's process does nothing else meanwhile)."""
    import torch.export.pt2_archive._package as package

    real_load, real_pickle, real_obj = torch.load, package.pickle, torch._C._pickle_load_obj
    unsafe_asked = []

    def load(f, *args, **kwargs):
        if kwargs.get("weights_only") is False or kwargs.get("pickle_module") is not None or len(args) > 1:
            unsafe_asked.append(True)
        kwargs.pop("pickle_module", None)
        kwargs["weights_only"] = True
        return real_load(f, *args[:1], **kwargs)

    def refuse(*_args, **_kwargs):
        raise _Refused("the program holds a Python object constant, which only an unrestricted unpickler reads")

    class _NoPickle:
        loads = load_obj = staticmethod(refuse)

    forced = os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    torch.load, package.pickle, torch._C._pickle_load_obj = load, _NoPickle, refuse
    try:
        yield unsafe_asked
    finally:
        torch.load, package.pickle, torch._C._pickle_load_obj = real_load, real_pickle, real_obj
        if forced is not None:
            os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = forced


def load_program(torch, path: str | os.PathLike, trust_programs: bool = False, verified: bool = False):
    """``torch.export.load(path)`` behind the walls of the module docstring.

    Args:
        verified: The caller has just made the upload check (:func:`device.uploads.artifacts.verify`) itself.

    Raises:
        UnsafeArtifactError: Programs are not trusted here, the file fails the upload check, or loading it needed an
            unrestricted unpickler (the fallback was refused, nothing of the file was unpickled that way).
        Exception: Whatever torch raises for a damaged or foreign program (the callers name it).
    """
    if not verified:
        verify(path, "torch-export", trust_programs)
    with _weights_only(torch) as unsafe_asked:
        try:
            return torch.export.load(os.fspath(path))
        except _Refused as err:
            raise UnsafeArtifactError(f"{Path(path).name}: {err}; refused",
                                      fix="export tensor constants only (torch.export.save of a plain module)") from None
        except Exception as err:
            if unsafe_asked:
                raise UnsafeArtifactError(
                    f"{Path(path).name}: torch.export.load fell back to an unrestricted torch.load "
                    f"(weights_only=False) after the safe load failed ({_first_line(err)}); "
                    "the fallback is refused on this device",
                    fix="save the program with torch.export.save from a module whose weights, constants and example "
                        "inputs are plain tensors") from None
            raise


def program_module(program, path: str | os.PathLike):
    """``program.module()``: torch generates and ``exec`` s the module's source here, so what it raises (a
    ``SyntaxError`` from a crafted name, a guard that fails) fails the job with the reason."""
    try:
        return program.module()
    except Exception as err:  # noqa: BLE001 (torch's codegen raises SyntaxError, AssertionError, RuntimeError …)
        raise RunnerError(f"{Path(path).name}: torch could not build the program's module ({_first_line(err)})",
                          fix="re-export it with torch.export.save, or send the rung's device checkpoint "
                              "(<rung>.device.pt)") from None


def load_checkpoint_module(path: str | os.PathLike) -> tuple[Any, dict[str, Any]]:
    """The module a device checkpoint describes, rebuilt by this device's code (:mod:`device.uploads.torch_checkpoint`).

    Returns:
        The module (CPU, eval) and its facts (``arch``, ``source``, ``quantized``, ``input_chw``, ``modelopt``).

    Raises:
        CheckpointError: The file fails its check, names an architecture this device lacks or builds otherwise, or
            its state does not fit.
    """
    from device.uploads.torch_checkpoint import load_for_export

    try:
        return load_for_export(path)
    except EdgeFoldError:
        raise
    except Exception as err:  # noqa: BLE001 (a builder of an installed package can raise anything)
        raise CheckpointError(f"{Path(path).name}: the device could not rebuild the module ({_first_line(err)})",
                              fix="send the .device.pt the pipeline's export or quantize stage wrote") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:200]}" if text else type(err).__name__

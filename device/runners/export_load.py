"""Loading a ``torch.export`` program on the device without trusting it.

``torch.export.load`` (torch 2.6-2.14) unpickles pickled weights and constants with ``weights_only=False``, retries
sample inputs with ``weights_only=False`` when the safe load refuses them, and reads opaque and TorchScript constants
with ``pickle.loads`` and ``torch._C._pickle_load_obj``. Two walls keep a crafted file from running code here:

1. the upload check (:func:`device.archive_check.check_program`), made again on the stored file first;
2. while torch loads, every ``torch.load`` runs with ``weights_only=True`` whatever the caller asked, and the two raw
   unpicklers refuse to run at all. A file that needed the unsafe path fails with the reason instead of being loaded
   the unsafe way. Forcing rather than refusing ``weights_only=False`` keeps a program whose pickled weights are
   plain tensors loadable: torch's own weights-only unpickler reads those.

torch is imported by the caller; this module imports nothing heavy.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from device.artifacts import UnsafeArtifactError, verify


class _Refused(Exception):
    pass


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


def load_program(torch, path: str | os.PathLike):
    """``torch.export.load(path)`` behind the two walls of the module docstring.

    Raises:
        UnsafeArtifactError: The file fails the upload check, or loading it needed an unrestricted unpickler (the
            fallback was refused, nothing of the file was unpickled that way).
        Exception: Whatever torch raises for a damaged or foreign program (the callers name it).
    """
    verify(path, "torch-export")
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
                    f"(weights_only=False) after the safe load failed ({str(err).splitlines()[0][:200] if str(err) else type(err).__name__}); "
                    "the fallback is refused on this device",
                    fix="save the program with torch.export.save from a module whose weights, constants and example "
                        "inputs are plain tensors") from None
            raise

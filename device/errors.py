"""The one exception tree of EdgeFold.

Every error a user can cause derives from :class:`EdgeFoldError` and carries a ``fix``: the
command or change that makes it go away. The CLIs print ``error: <message>`` and ``fix: <fix>``
and exit with status 2 instead of showing a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class EdgeFoldError(Exception):
    """Base class of every error EdgeFold raises on purpose.

    Args:
        message: What went wrong, naming the offending value, key or path.
        fix: What the user should do about it.
    """

    exit_code = 2

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return self.message if not self.fix else f"{self.message}\n  fix: {self.fix}"

    def __reduce__(self):
        # Keeps the fix when the error crosses a process boundary (worker processes, the agent's jobs).
        return (self.__class__, (self.message, self.fix))


class ConfigError(EdgeFoldError):
    """A recipe, option or argument is invalid."""


class UnknownKeyError(ConfigError):
    """A name looked up in a registry does not exist."""


class DataError(EdgeFoldError):
    """A data set is missing, malformed or inconsistent with the recipe."""


class CheckpointError(EdgeFoldError):
    """A checkpoint is missing, corrupt, or does not fit the architecture it names."""


class ManifestError(EdgeFoldError):
    """A run directory or its manifest is unusable."""


class StageError(EdgeFoldError):
    """A stage could not produce what it promises (a target missed, a check failed)."""


class StatusError(EdgeFoldError):
    """An error that maps to an HTTP status (the agent's refusals, the client's view of them)."""

    default_status = 400

    def __init__(self, message: str, fix: str | None = None, status: int | None = None):
        super().__init__(message, fix)
        self.status = self.default_status if status is None else status

    def __reduce__(self):
        return (self.__class__, (self.message, self.fix, self.status))


class MissingDependencyError(EdgeFoldError):
    """An optional dependency needed for this operation is not installed."""


def require(module: str, what: str, fix: str) -> ModuleType:
    """Imports an optional dependency, or raises :class:`MissingDependencyError` saying what to install.

    Args:
        module: The import name (``onnxruntime``, ``pynvml``).
        what: The package as users know it ("ONNX Runtime").
        fix: How to install it.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{what} is not installed", fix=fix) from None


class DeviceError(EdgeFoldError):
    """A failure on the device side: building an engine, loading or running a model, measuring.

    Not a :class:`StageError`: the pipeline's stages did nothing wrong when a board cannot build.
    """


class NothingMeasuredError(DeviceError):
    """A sweep measured none of its settings (each one's reason in the message)."""


class SweepStoppedError(DeviceError):
    """A sweep ended by an error between its first change and its restore; the message carries both outcomes
    (the job's error is all a failed job's result keeps)."""

    @classmethod
    def after(cls, err: BaseException, where: str, restore_note: str | None) -> "SweepStoppedError":
        """The error for a sweep that ``err`` stopped at ``where``, once the restore told ``restore_note``."""
        said = err.message if isinstance(err, EdgeFoldError) else f"{type(err).__name__}: {err}"
        return cls(f"the sweep stopped at {where}: {said}; {restore_note or 'nothing to restore'}",
                   fix=getattr(err, "fix", None) or "see the error; the agent restores the device from its hold "
                                                     "file at its next start if the job could not")


class NoEdgeMeasuredError(DeviceError):
    """Edge devices were named but none measured a rung: the report is written, the run did not do its job.

    Exits with 3, not 2, so a script tells "the run completed without its devices" from a bad input.
    """

    exit_code = 3


class ResultError(DeviceError):
    """A measurement result that does not fit the result schema."""


class SchemaVersionError(ResultError):
    """A result or results file written by another version of EdgeFold."""


class EngineBuildError(DeviceError):
    """TensorRT could not build (or plan) an engine on this device."""


class StaticShapeError(EngineBuildError):
    """The model's input shape does not admit the batch size a job measures (a static-batch ONNX)."""


class DlaError(EngineBuildError):
    """A DLA build was asked for that this device or TensorRT cannot give."""


class PrecisionMismatchError(EngineBuildError):
    """The requested precision contradicts the artifact (a Q/DQ model is INT8; a float model runs in its type)."""


class TimingCacheError(EngineBuildError):
    """TensorRT refused the timing cache file (built by another device or TensorRT version)."""


class RunnerError(DeviceError):
    """A runner failed while running a loaded model."""


class ProgramVersionError(RunnerError):
    """A ``torch.export`` program this device's torch cannot load (another serialization schema): both named."""


class ShapeOutsideProfileError(RunnerError):
    """A batch outside the engine's optimization profile (TensorRT's set_input_shape returned False)."""


class TensorRTCallError(RunnerError):
    """A TensorRT call that reports failure through its return value returned False."""

"""What a task gives the deploy stage written once (:mod:`pipeline.stages.deploy`).

The stage is the same sequence for every task: the devices of the run (a loopback agent when it names none), several
at once; on each, one session (:class:`pipeline.deploy.session.DeviceSession`: opened, its runtime chosen, each
window measured or reused, retried, cancelled when late) and every job once per round in interleaved rounds; then
``results.json`` with every device's outcome and the artifacts sent. A task says what it sends and how it reads what
comes back (:class:`DeployHooks`): its artifacts and evaluation sets, each window's job spec (the device
post-processor it names), each rung's record, and what it measures after the ladder (a sustained run).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from device.schema import JobSpec


@dataclass(frozen=True)
class Job:
    """What one window measures: a rung's file on a road (``tensorrt``: the ONNX road, its runtime chosen by
    ``deploy.runtime``; ``torch_tensorrt``: the PyTorch road)."""

    rung: str
    path: Path
    road: str = "tensorrt"

    @property
    def shown(self) -> str:
        """The window's name in the log and the cache (``student``, ``student@torch_tensorrt``)."""
        return self.rung if self.road == "tensorrt" else f"{self.rung}@{self.road}"


@dataclass
class Windows:
    """One device's jobs and how each window of them is asked for.

    Attributes:
        jobs: Measured in this order in every round.
        spec: The job of ``(job, round_index)``; its ``timeout_s`` (required) is the agent's limit, and the window is
            waited for two minutes longer.
        announce: What the log says when a window is measured, not reused (None: the session's progress lines only).
    """

    jobs: list[Job]
    spec: Callable[[Job, int], JobSpec]
    announce: Callable[[Job, int], str | None] = field(default=lambda job, round_index: None)


class DeployHooks(ABC):
    """A task's part of the deploy stage.

    Attributes:
        device_modules: What the agent's job process loads by name for this task's jobs, beyond
            ``device.jobs.jobrun`` and ``device.service.agent`` (a loopback agent runs this checkout's: an edit measures again).
        ship: See below.
    """

    device_modules: tuple[str, ...] = ()
    ship: Any = None
    """The task's :class:`pipeline.ship.task.ShipTask`: where the graph DeepStream's nvinfer runs differs from a
    rung's, the stage measures it as a form of the rung (:mod:`pipeline.deploy.nvinfer_form`); None: no form."""

    def preflight(self, ctx) -> None:
        """Refuses before the first stage what this task's jobs cannot get from the configured agents."""

    @abstractmethod
    def needs(self, ctx) -> tuple[str, ...]:
        """The stages whose outputs are sent."""

    @abstractmethod
    def prepare(self, ctx, workdir: Path) -> Any:
        """The run's plan, once for every device: at least ``artifacts`` (``{rung: Path}``, what is timed), and the
        files the jobs need (evaluation sets, frames), written under ``workdir``."""

    @abstractmethod
    def windows(self, ctx, session, plan) -> Windows | None:
        """One opened device's jobs (uploading what they share); None when the device cannot take them, with the
        reason in ``session.outcome``."""

    @abstractmethod
    def record(self, ctx, outcome: dict[str, Any], plan, rounds: dict[Job, list[dict[str, Any]]]) -> None:
        """Each rung's record from its windows' records, into ``outcome`` (``rungs``, and other roads where the task
        has them). ``outcome["reused"]`` lists the windows taken from the cache."""

    def after(self, ctx, plan, outcome: dict[str, Any], open_session: Callable[[], Any]) -> None:
        """What is measured on the device after the ladder's rounds (a sustained run), into ``outcome``;
        ``open_session()`` gives a new :class:`~pipeline.deploy.session.DeviceSession` of the same device."""

    def results(self, ctx, plan) -> dict[str, Any]:
        """What ``results.json`` holds beyond the devices and the artifacts (after every device was measured)."""
        return {}

    def cleanup(self, plan) -> None:
        """Removes the plan's files that are not outputs (evaluation sets), however the stage ended."""

    def evaluation_inputs(self, manifest, artifact: Path, indices: Sequence[int]):
        """The finished run's test images at ``indices`` (positions in its test split) as the deploy stage sent them
        to the device for the rung ``artifact`` (its ONNX): float32 N×C×H×W, the network's input. ``edgefold
        diverge`` runs them on the device and through ONNX Runtime here.

        Raises:
            ConfigError: The task does not say how its images reach the network.
        """
        from device.errors import ConfigError

        raise ConfigError(f"{type(self).__name__} does not say how its test images reach the network, so edgefold "
                          "diverge cannot rebuild the images the device ran",
                          fix="give the task's deploy hooks an evaluation_inputs (pipeline.deploy.hooks.DeployHooks)")

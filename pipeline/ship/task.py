"""What a task supplies to ``edgefold ship``: its rows read into one shape, and the files and settings only it knows.

The shared code (choosing the rung, fetching the engine, the Triton and DeepStream configs, the card) asks a
:class:`ShipTask` and never which task it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class ShipRow:
    """One rung measured on one device, as the report recorded it.

    Attributes:
        rung: The rung's name.
        device: The device's name in the run.
        accuracy: The task's accuracy figure in [0, 1] (top-1, mAP): the device's own when it scored the rung there,
            else the host's; None when not measured.
        accuracy_source: ``device`` or ``host``.
        accuracy_low: The lower end of its 95% interval (None where the report has none).
        accuracy_high: The upper end.
        latency_p50_ms: The median latency at ``batch``, over interleaved windows.
        batch: The batch those figures are at (the engine shipped).
        precision: The precision the device ran (``fp32``, ``fp16``, ``int8``).
        runtime: The runtime that ran (``tensorrt``, ``onnxruntime`` …).
        figures: Every other figure of the row the card shows (latency p99, throughput, energy, memory …).
        engines: Batch → the engine's key in the agent's cache, where the agent built one.
        measured: Whether the device measured it (a failed or absent rung is not shippable from that device).
        host_accuracy: The same figure on this host (ONNX Runtime) under EdgeFold's preprocessing: what the DeepStream
            feed's score, also taken on the host, is set against.
    """

    rung: str
    device: str
    accuracy: float | None
    accuracy_source: str
    accuracy_low: float | None
    accuracy_high: float | None
    latency_p50_ms: float | None
    batch: int
    precision: str
    runtime: str | None
    figures: dict[str, Any] = field(default_factory=dict)
    engines: dict[int, str] = field(default_factory=dict)
    measured: bool = True
    host_accuracy: float | None = None


class ShipTask(Protocol):
    """A task's part of shipping."""

    metric: str  # the accuracy figure's name: "top-1", "mAP"
    network_type: int  # nvinfer's network-type: 1 classifier, 100 other (the application decodes)

    def rows(self, run_dir: Path) -> list[ShipRow]:
        """Every rung × device the report recorded."""

    def model(self, run_dir: Path, rung: str) -> Path:
        """The rung's ONNX file as the device ran it."""

    def preprocess(self, run_dir: Path) -> dict[str, Any]:
        """``preprocess.json``'s part the task knows: ``kind`` (``resize_crop``, ``letterbox`` or ``letterbox_ultralytics``), ``input_size``,
        ``resize``, ``channels``, ``mean``, ``std`` (on the 0-1 scale), ``interpolation``."""

    def per_class_drops(self, run_dir: Path, rung: str, device: str) -> list[dict[str, Any]]:
        """The classes whose accuracy fell most against the teacher: ``{"class", "drop_points"}``, worst first."""

    def power_setting(self, run_dir: Path, rung: str, device: str) -> dict[str, Any] | None:
        """Where the run swept power modes: the setting ``deploy.latency_budget_ms`` picked for the rung on the device
        (least energy within the budget), as the report said it; None without a sweep."""

    def labels(self, run_dir: Path) -> list[str]:
        """The class names in the model's output order."""

    def postprocess(self, run_dir: Path, rung: str) -> dict[str, Any]:
        """``postprocess.json``: what turns the network's outputs into the answer."""

    def extra_files(self, run_dir: Path, rung: str, folder: Path) -> list[str]:
        """Writes what ``infer.py`` needs besides the shared files (a detector's decoder); returns their names."""

    def nvinfer(self, run_dir: Path, rung: str) -> dict[str, Any]:
        """The task's own ``nvinfer`` keys (its network type's)."""

    def softmax(self) -> bool:
        """Whether the DeepStream graph appends a Softmax (nvinfer's classifier parser reads probabilities)."""

    def nvinfer_accuracy(self, run_dir: Path, deepstream_model: Path, scaling: str) -> dict[str, Any]:
        """The rung's accuracy on the run's test split, on this host, fed as ``nvinfer`` feeds it under the task's
        keys (the whole image scaled to the network's size with ``scaling``, stretched or letterboxed; the shipped
        DeepStream graph): ``{"value", "images", "note"}``."""

    def score_answers(self, run_dir: Path, answers: dict[str, Any]) -> float:
        """The accuracy figure of ``infer.py``'s answers (``--json``) on the run's test images written by
        :meth:`write_test_images`."""

    def write_test_images(self, run_dir: Path, folder: Path) -> list[Path]:
        """The run's test split as image files (what ``infer.py`` reads), in the split's order."""

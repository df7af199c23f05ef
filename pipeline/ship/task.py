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
    flags: tuple[str, ...] = ()
    verdict: str | None = None
    precision_ran: str | None = None


NOISE_WORDS = {"busy_device": "the device was busy with other processes during its windows",
               "high_variance": "its latency varied beyond trtexec's warning (CV over 10%) across windows",
               "throttled": "the device throttled during its windows",
               "clocks_not_locked": "the clocks were not locked (jetson_clocks off)"}


def report_flags(row: dict[str, Any]) -> tuple[str, ...]:
    """What the report flagged on a row, in words: a busy or noisy window, a runtime that ran instead of the one
    asked for, energy not measured (with why), a degraded energy window."""
    flags = [NOISE_WORDS.get(flag, flag.replace("_", " ")) for flag in row.get("noise_flags") or ()]
    if row.get("runtime_fallback"):
        flags.append(str(row["runtime_fallback"]).split(" (fix:")[0])
    if row.get("energy_mj_per_image") is None and row.get("reason"):
        flags.append(f"energy and power not measured: {row['reason']}")
    elif row.get("energy_degraded"):
        flags.append(f"energy from a degraded window: {row.get('energy_note') or 'see the report'}")
    return tuple(flags)


def ran_precision(row: dict[str, Any], profiles: list[dict[str, Any]]) -> str | None:
    """The precision the device computed the rung in, where its own profile says otherwise than the graph's: an INT8
    graph run by ONNX Runtime's CPU provider computes every layer in float (its Q/DQ nodes are layers of their own)."""
    from pipeline.report.profile_report import computes_in

    precision = row.get("precision") or "fp32"
    profile = next((p for p in profiles if p.get("device") == row.get("device") and p.get("rung") == row.get("rung")
                    and p.get("status") == "measured"), None)
    if profile is None or computes_in(profile.get("profile"), precision):
        return None
    return (f"{precision} in the graph, but no compute layer ran in {precision.upper()} on {row.get('device')} "
            f"({row.get('runtime') or 'its runtime'} ran the Q/DQ nodes as layers of their own): its latency is not "
            f"an {precision.upper()} engine's")


def scored_rows(run_dir: Path, score: str, card_figures: tuple[str, ...]) -> list[ShipRow]:
    """The rows of a task whose device scores its rungs through its own post-processor (detection's ``map``,
    segmentation's ``miou``): the device's figure where it scored the rung, else the host's (``host_<score>``)."""
    import json

    from device.errors import ManifestError

    path = run_dir / "report" / "results.json"
    if not path.is_file():
        raise ManifestError(f"{run_dir} has no report yet: ship reads the figures the report recorded",
                            fix=f"finish the run first (make edge, or edgefold report {run_dir})")
    deployed = {d["name"]: d for d in json.loads((run_dir / "deploy" / "results.json").read_text()).get("devices", [])}
    results = json.loads(path.read_text())
    profiles = results.get("layer_profiles") or []
    rows = []
    for row in results["rows"]:
        on_device = row.get(score) is not None
        prefix = "" if on_device else "host_"
        record = deployed.get(row["device"], {}).get("rungs", {}).get(row["rung"], {})
        figures = {key: row.get(key) for key in (*card_figures, "latency_p50_low_ms", "latency_p50_high_ms")}
        figures["measured_batches"] = [int(b) for b in (record.get("latency_p50_ms") or {})]
        rows.append(ShipRow(rung=row["rung"], device=row["device"], accuracy=row.get(f"{prefix}{score}"),
                            accuracy_source="device" if on_device else "host",
                            accuracy_low=row.get(f"{prefix}{score}_low"), accuracy_high=row.get(f"{prefix}{score}_high"),
                            latency_p50_ms=row.get("latency_p50_ms"), batch=int(row.get("latency_batch") or 1),
                            precision=row.get("precision") or "fp32", runtime=row.get("runtime"), figures=figures,
                            engines={int(b): key for b, key in (record.get("engines") or {}).items()},
                            measured=row.get("status") == "measured", host_accuracy=row.get(f"host_{score}"),
                            flags=report_flags(row), verdict=row.get("verdict") or None,
                            precision_ran=ran_precision(row, profiles)))
    return rows


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

"""Where an engine's numbers part from its model: the first tensor, in the graph's order, whose values on the device
differ from ONNX Runtime's on the build host, found by bisection over debug jobs (``JobSpec.diverge``).

Marking every tensor as an output breaks TensorRT's fusions and runs out of memory (NVIDIA/TensorRT#4443, #3161), so
each debug job marks a few tensors spread over the part of the graph still in question; the first that parts bounds
the search from above, the last that agrees from below (Polygraphy's ``run --trt-outputs mark all`` and
``debug reduce``, done for the user). The search assumes that once a tensor parts, what reads it parts too (a
deviation propagates downstream); the answer is the first parting tensor after the last agreeing one it probed.

A tensor *parts* when, on any image, its relative L2 error against ONNX Runtime's value exceeds
``max_relative_error`` or its cosine distance exceeds ``max_cosine_distance``. The defaults (0.1 and 0.01) are
loose on purpose: an INT8 engine's fused kernels round differently from ONNX Runtime's Q/DQ arithmetic by a few
quantization steps everywhere, and what is sought is the layer where the numbers stop meaning the same thing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from device.errors import ConfigError
from pipeline.report.diverge_report import DIVERGE_SCHEMA, answer_text

# Ops whose outputs are no layer's answer: quantization plumbing, shapes and constants.
SKIPPED_OPS = {"QuantizeLinear", "DequantizeLinear", "Constant", "Shape", "Gather", "Unsqueeze", "Squeeze",
               "Cast", "Identity", "Reshape", "Flatten"}
MAX_RELATIVE_ERROR = 0.1
MAX_COSINE_DISTANCE = 0.01
DEFAULT_IMAGES = 4
DEFAULT_CHUNK = 4
DEFAULT_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Candidate:
    """A tensor the search may mark: its name, the node that writes it and the node's op."""

    name: str
    node: str
    op: str


def candidates(onnx_path: str | Path) -> list[Candidate]:
    """The float tensors written by the graph's compute nodes, in the graph's (topological) order, ending with the
    first graph output."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    try:
        types = {info.name: info.type.tensor_type.elem_type
                 for info in onnx.shape_inference.infer_shapes(model).graph.value_info}
    except Exception:  # noqa: BLE001 (unknown types are taken as float; ONNX Runtime would refuse an int output)
        types = {}
    # BF16 tensors are left out: NumPy has no bfloat16 for the device to return them in.
    floats = {0, onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    final = model.graph.output[0].name
    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type in SKIPPED_OPS and final not in node.output:
            continue
        for output in node.output:
            if output and types.get(output, 0) in floats and output != final:
                found.append(Candidate(output, node.name or f"{node.op_type}_{index}", node.op_type))
    writer = next(((node.name or f"{node.op_type}_{i}", node.op_type) for i, node in enumerate(model.graph.node)
                   if final in node.output), ("", ""))
    return found + [Candidate(final, *writer)]


def compare(device: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """The worst image's relative L2 error and cosine distance of ``device`` against ``reference`` (images first)."""
    if device.shape != reference.shape:
        return {"relative_error": math.inf, "cosine_distance": math.inf}
    d = device.reshape(len(device), -1).astype(np.float64)
    r = reference.reshape(len(reference), -1).astype(np.float64)
    if not np.all(np.isfinite(d)) or not np.all(np.isfinite(r)):  # either side overflowed: they do not agree
        return {"relative_error": math.inf, "cosine_distance": math.inf}
    norm_r, norm_d = np.linalg.norm(r, axis=1), np.linalg.norm(d, axis=1)
    relative = np.linalg.norm(d - r, axis=1) / np.maximum(norm_r, 1e-12)
    cosine = 1.0 - np.sum(d * r, axis=1) / np.maximum(norm_r * norm_d, 1e-12)
    both_zero = (norm_r == 0) & (norm_d == 0)
    relative[both_zero], cosine[both_zero] = 0.0, 0.0
    return {"relative_error": float(relative.max()), "cosine_distance": float(max(cosine.max(), 0.0))}


@dataclass
class Probe:
    """One debug job: the tensors it marked (indices into the order) and what each showed."""

    indices: list[int]
    metrics: dict[str, dict[str, float]]
    parted: list[str]
    job: str | None = None


@dataclass
class Search:
    """The answer: the first tensor that parts (None when even the output agrees) and every job it took."""

    order: list[Candidate]
    thresholds: dict[str, float]
    probes: list[Probe] = field(default_factory=list)
    first: int | None = None
    last_agreeing: int | None = None

    def document(self) -> dict[str, Any]:
        """The answer as JSON (a tensor whose values were not finite reads as an error of null)."""
        def finite(metrics: dict[str, float]) -> dict[str, float | None]:
            return {key: value if math.isfinite(value) else None for key, value in metrics.items()}

        first = self.order[self.first] if self.first is not None else None
        agreeing = self.order[self.last_agreeing] if self.last_agreeing is not None else None
        return {"tensors_in_order": len(self.order), "jobs": len(self.probes), "thresholds": self.thresholds,
                "first_parting": None if first is None else {
                    **asdict(first), "index": self.first,
                    **finite(next(p.metrics[first.name] for p in self.probes if first.name in p.metrics))},
                "last_agreeing": None if agreeing is None else {**asdict(agreeing), "index": self.last_agreeing},
                "probes": [{"job": p.job, "tensors": [self.order[i].name for i in p.indices], "parted": p.parted,
                            "metrics": {name: finite(m) for name, m in p.metrics.items()}} for p in self.probes]}


def spread(low: int, high: int, count: int) -> list[int]:
    """Up to ``count`` indices evenly spread strictly between ``low`` and ``high`` (both excluded)."""
    inside = high - low - 1
    if inside <= 0:
        return []
    count = min(count, inside)
    return sorted({low + round((i + 1) * (inside + 1) / (count + 1)) for i in range(count)} - {low, high})


def bisect(order: Sequence[Candidate], probe: Callable[[list[str]], tuple[dict[str, dict[str, float]], str | None]],
           chunk: int, max_relative_error: float = MAX_RELATIVE_ERROR,
           max_cosine_distance: float = MAX_COSINE_DISTANCE) -> Search:
    """Finds the first tensor of ``order`` that parts, marking ``chunk`` tensors a job.

    The first job marks the graph's output and ``chunk - 1`` tensors spread before it; each later job marks up to
    ``chunk`` tensors between the last that agreed and the first that parted. With ``chunk = 1`` that is one job for
    the output and then a binary search: at most ⌈log2(n)⌉ + 1 jobs for n tensors.

    Args:
        probe: Marks the named tensors in one debug job; returns each one's :func:`compare` metrics and the job's id.
    """
    if chunk < 1:
        raise ConfigError(f"chunk {chunk}: a debug job marks at least one tensor", fix="--chunk 1 or more")
    thresholds = {"max_relative_error": max_relative_error, "max_cosine_distance": max_cosine_distance}
    search = Search(list(order), thresholds)

    def run(indices: list[int]) -> list[int]:
        metrics, job = probe([order[i].name for i in indices])
        parted = [i for i in indices if metrics[order[i].name]["relative_error"] > max_relative_error
                  or metrics[order[i].name]["cosine_distance"] > max_cosine_distance]
        search.probes.append(Probe(indices, metrics, [order[i].name for i in parted], job))
        return parted

    low, high = -1, len(order) - 1
    first_job = spread(low, high, chunk - 1) + [high]
    parted = run(first_job)
    if not parted:
        search.last_agreeing = high
        return search
    high = parted[0]
    low = max([i for i in first_job if i < high], default=low)
    while True:
        picks = spread(low, high, chunk)
        if not picks:
            break
        parted = run(picks)
        if parted:
            low = max([i for i in picks if i < parted[0]], default=low)
            high = parted[0]
        else:
            low = picks[-1]
    search.first = high
    search.last_agreeing = low if low >= 0 else None
    return search


def chunk_for(shapes: dict[str, tuple[int, ...]], images: int, wanted: int, max_bytes: int) -> int:
    """How many tensors one job may mark so that even the largest ``wanted`` fit ``max_bytes`` (float32)."""
    per_image = sorted((int(np.prod(shape[1:])) * 4 for shape in shapes.values()), reverse=True)
    fitting = 0
    total = 0
    for size in per_image[:wanted]:
        if (total + size) * images > max_bytes:
            break
        total += size
        fitting += 1
    if fitting == 0:
        raise ConfigError(f"one tensor of {images} images is over the job's limit of {max_bytes} bytes",
                          fix="run fewer images (--images) or raise --max-mib")
    return fitting


def reference_values(onnx_path: str | Path, names: Sequence[str], images: np.ndarray,
                     batch: int) -> dict[str, np.ndarray]:
    """ONNX Runtime's values of ``names`` on ``images`` on this host (CPU), at the job's batch (padded, cut)."""
    from device.scoring.evaluation import padded_batches
    from device.runners.onnxruntime import OnnxRuntimeRunner

    kept: dict[str, list[np.ndarray]] = {name: [] for name in names}
    with OnnxRuntimeRunner(onnx_path, marked=tuple(names)) as runner:
        for chunk, real in padded_batches(images, batch):
            for name, value in runner.run_marked(chunk).items():
                kept[name].append(value[:real])
    return {name: np.concatenate(parts) for name, parts in kept.items()}


def agent_probe(client, artifact: str, evaluation: str, images: np.ndarray, spec: dict[str, Any],
                reference: Callable[[list[str]], dict[str, np.ndarray]], max_bytes: int,
                timeout_s: float = 3600.0, on_job: Callable[[str], None] | None = None):
    """A :func:`bisect` probe that runs each debug job on an agent: the rung's own runtime, precision and batch
    (``spec``, the deploy stage's job), the first ``len(images)`` images of the uploaded ``evaluation`` set."""
    from device.errors import DeviceError
    from device.schema import DivergeSpec, EvaluationSpec, JobSpec

    def probe(names: list[str]) -> tuple[dict[str, dict[str, float]], str | None]:
        job_spec = JobSpec(artifact=artifact, runtime=spec["runtime"], precision=spec.get("precision", "fp32"),
                           batch_sizes=[spec["batch"]], iterations=2, profile=False,
                           # The set only names the images: a debug job post-processes nothing, whatever the task.
                           evaluation=EvaluationSpec(artifact=evaluation, images=spec["evaluation_images"],
                                                     postprocess="none"),
                           diverge=DivergeSpec(tensors=names, images=len(images), max_bytes=max_bytes),
                           label=spec.get("label", "diverge"), timing_cache=spec.get("timing_cache"),
                           dla_core=spec.get("dla_core"))
        submitted = client.submit(job_spec)
        if on_job:
            on_job(f"job {submitted['id']}: {len(names)} tensor(s) marked")
        job = client.wait(submitted["id"], timeout_s=timeout_s)
        if job["state"] != "succeeded":
            raise DeviceError(f"debug job {job['id']} {job['state']}: {job.get('error')}",
                              fix="see the agent's job log (GET /v1/jobs/ID); a tensor TensorRT folded away cannot "
                                  "be marked: the error names the ones it has")
        device = client.tensors(job)
        expected = reference(names)
        return {name: compare(device[name], expected[name]) for name in names}, job["id"]

    return probe


def rung_on_device(run_dir: Path, rung: str, device: str) -> dict[str, Any]:
    """What the deploy stage recorded of ``rung`` on ``device`` (a device name or agent URL): the artifact, the job
    spec it ran, the device's record, the evaluation set's indices.

    Raises:
        ConfigError: A rung that does not exist, a device the run did not deploy to, or one that did not build the rung.
    """
    import json

    from device.errors import ManifestError
    from pipeline.core.manifest import Manifest

    manifest = Manifest.load(run_dir)
    if not manifest.stage("deploy"):
        raise ManifestError(f"{run_dir} has not deployed yet", fix=f"finish the run first: make edge "
                                                                   f"MODEL={manifest.data.get('model')} EDGE=URL")
    results = json.loads(manifest.output("deploy", "results").read_text())
    artifacts = results.get("artifacts", {})
    if rung not in artifacts:
        raise ConfigError(f"run {run_dir.name} has no rung {rung!r}; it deployed {', '.join(sorted(artifacts))}",
                          fix="pass one of those to --rung")
    known = [d for d in results.get("devices", []) if device in (d.get("name"), d.get("url"))]
    if not known:
        named = ", ".join(f"{d.get('name')} ({d.get('url')})" for d in results.get("devices", []))
        raise ConfigError(f"run {run_dir.name} did not deploy to {device!r}; it deployed to {named}",
                          fix="pass a device name or agent URL the run measured, or deploy there first "
                              "(make edge EDGE=URL)")
    outcome = known[0]
    record = outcome.get("rungs", {}).get(rung, {})
    if record.get("state") != "succeeded":
        raise ConfigError(f"{outcome.get('name')} has not built {rung}: {record.get('state', 'not measured')}"
                          + (f" ({record['error']})" if record.get("error") else ""),
                          fix="deploy the rung to that device first (make edge EDGE=URL), then run edgefold diverge")
    if outcome.get("url") == "loopback":
        raise ConfigError("the loopback agent runs ONNX Runtime on this host, the reference itself: there is nothing "
                          "to part", fix="run edgefold diverge against a device agent (--device URL)")
    evaluation = results.get("evaluation") or {}
    if not evaluation.get("indices"):
        raise ConfigError("the deploy stage scored no evaluation set on the devices (deploy.evaluate_images: 0)",
                          fix="deploy again with deploy.evaluate_images set: its images are the ones compared")
    return {"artifact": artifacts[rung], "spec": record["spec"], "outcome": outcome, "evaluation": evaluation,
            "manifest": manifest}


def diverge_run(run_dir: Path, rung: str, device: str, token: str | None, *,
                inputs: Callable[[Any, Path, Sequence[int]], np.ndarray], images: int = DEFAULT_IMAGES,
                chunk: int = DEFAULT_CHUNK, max_bytes: int = DEFAULT_MAX_BYTES,
                max_relative_error: float = MAX_RELATIVE_ERROR, max_cosine_distance: float = MAX_COSINE_DISTANCE,
                log: Callable[[str], None] = print, batch: int | None = None) -> tuple[dict[str, Any], Path]:
    """``edgefold diverge``: the search on one rung of a finished run, on one device it deployed to.

    Args:
        inputs: The task's images as its deploy stage sent them (its deploy hooks' ``evaluation_inputs``: the
            manifest, the rung's ONNX, the test-split indices).
        batch: The engine's batch (TensorRT builds one engine per batch): default the one the deploy stage scored
            first, the largest it measured.

    Returns:
        The answer (:meth:`Search.document` with the rung, device and images) and the file it was written to,
        ``<run>/diverge/<rung>@<device>.json``, which the report reads.
    """
    import tempfile
    import time

    from device.client import AgentClient
    from device.files import sha256_file, write_json_atomic

    found = rung_on_device(run_dir, rung, device)
    onnx_path = run_dir / found["artifact"]["path"]
    if not onnx_path.is_file() or sha256_file(onnx_path) != found["artifact"]["sha256"]:
        raise ConfigError(f"{onnx_path} is not the file the run deployed (changed or gone)",
                          fix="deploy the run again (make edge EDGE=URL), then run edgefold diverge")
    evaluation = found["evaluation"]
    count = min(images, evaluation["images"])
    chosen = np.ascontiguousarray(inputs(found["manifest"], onnx_path, evaluation["indices"][:count]),
                                  dtype=np.float32)
    spec = found["spec"]
    if batch is not None and batch not in spec["batch_sizes"]:
        raise ConfigError(f"{rung} was measured at batch sizes {spec['batch_sizes']} on {device}, not {batch}",
                          fix=f"--batch {max(spec['batch_sizes'])}")
    batch = batch or max(spec["batch_sizes"])
    order = candidates(onnx_path)
    shapes = {name: value.shape for name, value in
              reference_values(onnx_path, [c.name for c in order], chosen[:1], 1).items()}
    fitting = chunk_for(shapes, count, chunk, max_bytes)
    log(f"diverge: {rung} on {found['outcome']['name']}: {len(order)} tensors in graph order, {fitting} marked a job, "
        f"{count} images; at most {math.ceil(math.log(len(order), fitting + 1)) + 1 if len(order) > 1 else 1} jobs")
    outcome = found["outcome"]
    with AgentClient(outcome["url"], token, timeout_s=60) as client, \
            tempfile.TemporaryDirectory(prefix="edgefold-diverge-") as folder:
        client.upload(onnx_path)
        # The compared images as their own small set: the agent need not still hold the deploy stage's.
        images_path = Path(folder) / "images.npy"
        np.save(images_path, chosen, allow_pickle=False)
        probe = agent_probe(client, found["artifact"]["sha256"], client.upload(images_path), chosen,
                            {"runtime": spec["runtime"], "precision": spec.get("precision", "fp32"), "batch": batch,
                             "evaluation_images": count, "label": f"diverge/{rung}",
                             "timing_cache": spec.get("timing_cache"), "dla_core": spec.get("dla_core")},
                            lambda names: reference_values(onnx_path, names, chosen, batch), max_bytes,
                            on_job=lambda text: log(f"diverge: {text}"))
        search = bisect(order, probe, fitting, max_relative_error, max_cosine_distance)
    document = {"schema": DIVERGE_SCHEMA, "rung": rung, "device": outcome["name"], "url": outcome["url"],
                "runtime": spec["runtime"], "batch_size": batch, "images": count, "onnx": found["artifact"],
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **search.document()}
    path = run_dir / "diverge" / f"{rung}@{_file_safe(outcome['name'])}.json"
    path.parent.mkdir(exist_ok=True)
    write_json_atomic(path, document, indent=1)
    log(answer_text(document))
    return document, path


def _file_safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:80] or "device"

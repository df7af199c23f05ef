"""A debug job's pass (``JobSpec.diverge``): the evaluation set's first images through an engine built with some of the
graph's tensors marked as outputs, those tensors kept in ``tensors.npz`` beside the job for the build host.

Never timed, and nothing else of a benchmark job runs: marking outputs changes which layers TensorRT may fuse, so
the engine is not the one the rung's latency came from (it is cached apart, ``BuildOptions.mark_outputs``).
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from device.errors import ConfigError
from device.scoring.evaluation import load_evaluation_set, padded_batches
from device.files import atomic_writer, sha256_file

TENSORS_FILE = "tensors.npz"


class DivergeTooLargeError(ConfigError):
    """The marked tensors of the asked images would exceed the job's ``max_bytes``."""


def run_marked_pass(runner, spec, evaluation_path: str, job_dir: Path, chw: Sequence[int]) -> dict[str, Any]:
    """Runs the pass and writes ``job_dir/tensors.npz`` (one array per tensor, images first, float32).

    Returns:
        ``device.schema.DivergeResult`` as a dict.

    Raises:
        DivergeTooLargeError: The values would exceed ``spec.diverge.max_bytes`` (found before anything runs where the
            runner can say its tensors' shapes, TensorRT; else on the first batch, before the rest run).
        EvaluationSetError: The set is not the one the job names.
    """
    asked = spec.diverge
    batch = spec.batch_sizes[0]
    data = load_evaluation_set(evaluation_path, spec.evaluation.artifact, spec.evaluation.images, chw)
    started = time.perf_counter()
    # Known before anything runs where the runtime can say (TensorRT's context shapes), else after the first batch.
    checked = hasattr(runner, "marked_shapes")
    if checked:
        _check_size({name: int(np.prod(shape[1:])) * 4 for name, (shape, _) in runner.marked_shapes(batch).items()},
                    asked)
    kept: dict[str, list[np.ndarray]] = {name: [] for name in asked.tensors}
    for chunk, real in padded_batches(data[: asked.images], batch):
        values = runner.run_marked(chunk)
        if not checked:
            _check_size({name: value[0].nbytes for name, value in values.items()}, asked)
            checked = True
        for name in asked.tensors:
            kept[name].append(values[name][:real])
        del values
    arrays = {name: np.concatenate(parts) for name, parts in kept.items()}
    del kept
    # Keys by position, not by tensor name: an ONNX name may hold characters a zip member should not. Written straight
    # to the file (no second copy in memory), then hashed from it.
    with atomic_writer(job_dir / TENSORS_FILE, text=False) as handle:
        np.savez(handle, **{f"t{index}": arrays[name] for index, name in enumerate(asked.tensors)})
    digest, size = sha256_file(job_dir / TENSORS_FILE), (job_dir / TENSORS_FILE).stat().st_size
    layers = runner.marked_layers()
    return {"images": asked.images, "batch_size": batch, "sha256": digest, "size_bytes": size,
            "seconds": time.perf_counter() - started,
            "tensors": [{"name": name, "shape": list(arrays[name].shape), "layer": layers.get(name) or None}
                        for name in asked.tensors]}


def _check_size(per_image: dict[str, int], asked) -> None:
    """Raises :class:`DivergeTooLargeError` when the marked tensors' float32 values of the asked images exceed
    ``max_bytes``."""
    total = sum(per_image.values()) * asked.images
    if total > asked.max_bytes:
        raise DivergeTooLargeError(
            f"{len(per_image)} marked tensors of {asked.images} images are {total} bytes as float32, over the job's "
            f"max_bytes {asked.max_bytes}",
            fix="mark fewer tensors per job or run fewer images (edgefold diverge --chunk / --images)")


def read_tensors(blob: bytes, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The arrays of a ``tensors.npz`` by tensor name (``names`` in the job's order); no pickles are read."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as stored:
        if sorted(stored.files) != sorted(f"t{index}" for index in range(len(names))):
            raise ConfigError(f"the tensors file holds {len(stored.files)} arrays, the job marked {len(names)}",
                              fix="run the debug job again")
        return {name: np.asarray(stored[f"t{index}"], dtype=np.float32) for index, name in enumerate(names)}

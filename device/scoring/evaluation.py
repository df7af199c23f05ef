"""Scoring the engine that was timed: the evaluation set through the same runner, once, after the windows.

The build host's ONNX Runtime figure and the device's engine differ (FP16 accumulation, fused INT8
residual adds, another GPU's rounding): a rung's accuracy on its device row comes from here. The set
is the test images preprocessed once on the build side with the shared preprocessing; the device
returns each image's top-k classes, never logits, and the build host, which holds the labels, scores
them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from device.files import sha256_file
from device.errors import ConfigError


class EvaluationSetError(ConfigError):
    """An evaluation set that is not the one the job names, or does not fit the model's input."""


def load_evaluation_set(path: str | Path, artifact: str, images: int, chw: Sequence[int]) -> np.ndarray:
    """The stored set, memory-mapped, once its bytes, shape, dtype and count match what the job says.

    Raises:
        EvaluationSetError: A hash, count or shape that does not match, naming both.
    """
    actual = sha256_file(path)
    if actual != artifact:
        raise EvaluationSetError(f"the evaluation set's bytes hash to sha256 {actual}, not {artifact} as the job says",
                                 fix="upload the set again (the deploy stage does), then resubmit the job")
    data = np.load(path, mmap_mode="r", allow_pickle=False)
    if data.ndim != 4 or tuple(data.shape[1:]) != tuple(chw) or data.dtype != np.float32:
        raise EvaluationSetError(
            f"the evaluation set holds {data.dtype} images of shape {tuple(data.shape)}, but the model takes "
            f"float32 N×{'×'.join(map(str, chw))}",
            fix="build the set with the preprocessing recorded with this model (export/preprocess.json)")
    if data.shape[0] != images:
        raise EvaluationSetError(f"the evaluation set holds {data.shape[0]} images, the job says {images}",
                                 fix="resubmit the job with the set's own count")
    return data


def padded_batches(data: np.ndarray, batch: int):
    """``(chunk, real)`` over the set at exactly ``batch`` images: an engine built for this batch only gets the
    last batch padded with its last image repeated; ``real`` says how many of the chunk's outputs to keep."""
    for start in range(0, len(data), batch):
        chunk = np.asarray(data[start : start + batch], dtype=np.float32)
        real = len(chunk)
        if real < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - real, axis=0)])
        yield chunk, real


def network_then_post(runner, data: np.ndarray, batch: int, post) -> tuple[list[Any], float, float]:
    """Each padded batch through ``runner``, then ``post(outputs, real)`` on its float32 outputs, timed apart: what a
    task that decodes on the device (NMS, an argmax) reports as its network and post-processing seconds.

    Returns:
        What ``post`` returned for each batch, the network's seconds and the post-processing's.
    """
    answers, network, postprocess = [], 0.0, 0.0
    for chunk, real in padded_batches(data, batch):
        began = time.perf_counter()
        outputs = np.asarray(runner.infer(chunk), dtype=np.float32)
        middle = time.perf_counter()
        answers.append(post(outputs, real))
        postprocess += time.perf_counter() - middle
        network += middle - began
    return answers, network, postprocess


def evaluate_job(runner, job: dict[str, Any], evaluation, chw: Sequence[int], batch_sizes: Sequence[int]) -> dict[str, Any]:
    """The ``top_k`` post-processor (:mod:`device.scoring.postprocessors`): :func:`evaluate_runner` on the job's set."""
    return evaluate_runner(runner, job["evaluation_path"], evaluation.artifact, evaluation.images, evaluation.top_k,
                           chw, batch_sizes)


def evaluate_runner(runner, path: str | Path, artifact: str, images: int, top_k: int, chw: Sequence[int],
                    batch_sizes: Sequence[int]) -> dict[str, Any]:
    """Runs every image of the set through ``runner`` at the largest batch it was built for.

    Args:
        runner: The loaded runner whose engine was timed.
        path: The stored ``.npy`` (float32, N×C×H×W).
        artifact: Its sha256 as the job names it (checked against the bytes).
        images: N as the job names it.
        top_k: Classes kept per image.
        chw: The model's input C×H×W.
        batch_sizes: The batches the job measured (the runner may accept only those).

    Returns:
        ``device.schema.EvaluationResult`` as a dict.

    Raises:
        EvaluationSetError: A hash, count or shape that does not match, naming both.
    """
    data = load_evaluation_set(path, artifact, images, chw)
    batch = max(batch_sizes)
    started = time.perf_counter()
    predictions = []
    for chunk, real in padded_batches(data, batch):
        logits = np.asarray(runner.infer(chunk), dtype=np.float32).reshape(batch, -1)[:real]
        predictions.append(np.argsort(-logits, axis=1, kind="stable")[:, :top_k])
    ranked = np.concatenate(predictions).astype(int)
    return {"artifact": artifact, "images": images, "top_k": int(ranked.shape[1]), "batch_size": batch,
            "seconds": time.perf_counter() - started, "predictions": ranked.tolist()}


def frame_answer(job: dict[str, Any], evaluation, k: int = 5):
    """The ``top_k`` post-processor's answer to a camera frame: its k best classes (:func:`device.jobs.frame.top_k`)."""
    from device.jobs.frame import top_k_answer

    return top_k_answer(k)

"""Scoring a detection engine that was timed: the evaluation set through the same runner, then the device's own
decode + NMS (:mod:`device.scoring.detection_post`) on every batch, the two timed apart.

The device returns each image's detections (boxes in the network input's pixels, scores, class indices); the build
host, which holds the boxes, scales them to the images and computes COCO mAP, as it scores a classifier's top-k.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from device.scoring.detection_post import load_head_spec, postprocess
from device.scoring.evaluation import EvaluationSetError, load_evaluation_set, network_then_post
from device.files import sha256_file


def evaluate_job(runner, job: dict[str, Any], evaluation, chw: Sequence[int], batch_sizes: Sequence[int]) -> dict[str, Any]:
    """The ``detection`` post-processor (:mod:`device.scoring.postprocessors`): :func:`evaluate_detection_runner` on the job's
    set with its sidecar."""
    return evaluate_detection_runner(runner, job["evaluation_path"], evaluation.artifact, evaluation.images,
                                     job["head_path"], evaluation.head, chw, batch_sizes)


def checked_head(head_path: str | Path, head: str | None):
    """The stored sidecar's decoding (:class:`device.scoring.detection_post.HeadSpec`) once its bytes are the job's ``head``.

    Raises:
        EvaluationSetError: Another sidecar's bytes, naming both hashes.
    """
    actual = sha256_file(head_path)
    if actual != head:
        raise EvaluationSetError(f"the detection sidecar's bytes hash to sha256 {actual}, not {head} as the job says",
                                 fix="upload the sidecar again, then resubmit the job")
    return load_head_spec(head_path)


def evaluate_detection_runner(runner, path: str | Path, artifact: str, images: int, head_path: str | Path,
                              head: str, chw: Sequence[int], batch_sizes: Sequence[int]) -> dict[str, Any]:
    """Runs every image of the set through ``runner`` at its largest batch and post-processes each batch.

    Args:
        runner: The loaded runner whose engine was timed.
        path: The stored evaluation set (``.npy``, float32 N×C×H×W).
        artifact: Its sha256 as the job names it.
        images: N as the job names it.
        head_path: The stored sidecar; ``head`` is its sha256 as the job names it.
        chw: The model's input C×H×W.
        batch_sizes: The batches the job measured (the runner may accept only those).

    Returns:
        ``device.schema.EvaluationResult`` as a dict, with ``detections``, ``network_s`` and ``postprocess_s``.

    Raises:
        EvaluationSetError: The set or the sidecar is not the one the job names, or does not fit the model.
        HeadSpecError: The sidecar does not decode this model's output.
    """
    spec = checked_head(head_path, head)
    data = load_evaluation_set(path, artifact, images, chw)
    batch = max(batch_sizes)
    found, network, post = network_then_post(runner, data, batch, lambda raw, real: postprocess(spec, raw[:real]))
    detections = [{"boxes": d["boxes"].tolist(), "scores": d["scores"].tolist(), "labels": d["labels"].tolist()}
                  for chunk in found for d in chunk]
    return {"artifact": artifact, "images": images, "top_k": 1, "batch_size": batch, "seconds": network + post,
            "detections": detections, "network_s": network, "postprocess_s": post}


def frame_answer(job: dict[str, Any], evaluation, k: int = 5):
    """The ``detection`` post-processor's answer to a camera frame: the first image's detections by the sidecar the
    job's evaluation names (its decode + NMS, in the network input's pixels); two agree on the same classes and boxes
    (to 1e-4 px, a runtime's rounding).

    Raises:
        EvaluationSetError: The job names no sidecar (its evaluation's ``head``), or the stored one is another's.
    """
    from device.jobs.frame import FrameAnswer

    if evaluation is None or not job.get("head_path"):
        raise EvaluationSetError("a detection frame is decoded by the job's detection sidecar: the job has none",
                                 fix="send frame.postprocess detection with the round's evaluation (its head)")
    spec = checked_head(job["head_path"], evaluation.head)

    def boxes(outputs) -> dict[str, np.ndarray]:
        return postprocess(spec, np.asarray(outputs, dtype=np.float32)[:1])[0]

    def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
        return bool(np.array_equal(a["labels"], b["labels"]) and a["boxes"].shape == b["boxes"].shape
                    and np.allclose(a["boxes"], b["boxes"], rtol=0, atol=1e-4))

    return FrameAnswer(boxes, same)

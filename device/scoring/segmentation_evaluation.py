"""Scoring a segmentation engine that was timed: the evaluation set through the same runner, then the argmax over
classes on the device after every batch, the two timed apart.

The device returns each image's mask (one class index per pixel, ``uint8``), packed: zlib over the N×H×W bytes,
base64 in the JSON (a 64-image set of 64×64 masks is a few kB, never the logits' megabytes). The build host, which
holds the true masks, computes mIoU with its interval, as it scores a classifier's top-k.
"""

from __future__ import annotations

import base64
import zlib
from typing import Any, Sequence

import numpy as np

from device.scoring.evaluation import EvaluationSetError, load_evaluation_set, network_then_post

MAX_CLASSES = 255
"""Class indices travel as one byte."""


def pack_masks(masks: np.ndarray) -> str:
    """N×H×W class indices as the result carries them (zlib over the uint8 bytes, base64)."""
    return base64.b64encode(zlib.compress(np.ascontiguousarray(masks, dtype=np.uint8).tobytes(), 6)).decode("ascii")


def unpack_masks(packed: str, shape: Sequence[int]) -> np.ndarray:
    """The masks :func:`pack_masks` packed, as N×H×W ``uint8``.

    Raises:
        ValueError: The bytes do not hold ``shape`` (a truncated or foreign result).
    """
    raw = zlib.decompress(base64.b64decode(packed.encode("ascii")))
    if len(raw) != int(np.prod(shape)):
        raise ValueError(f"the packed masks hold {len(raw)} bytes, not {'×'.join(map(str, shape))}")
    return np.frombuffer(raw, dtype=np.uint8).reshape(tuple(shape))


def evaluate_job(runner, job: dict[str, Any], evaluation, chw: Sequence[int],
                 batch_sizes: Sequence[int]) -> dict[str, Any]:
    """The ``segmentation`` post-processor (:mod:`device.scoring.postprocessors`): every image of the job's set through
    ``runner`` at its largest batch, the argmax over classes after each batch.

    Returns:
        ``device.schema.EvaluationResult`` as a dict, with ``masks``, ``mask_shape``, ``network_s`` and
        ``postprocess_s``.

    Raises:
        EvaluationSetError: The set is not the one the job names, or the engine's output is not N×classes×H×W.
    """
    data = load_evaluation_set(job["evaluation_path"], evaluation.artifact, evaluation.images, chw)
    batch = max(batch_sizes)

    def argmax(logits: np.ndarray, real: int) -> np.ndarray:
        if logits.ndim != 4 or logits.shape[0] != batch or not 1 < logits.shape[1] <= MAX_CLASSES:
            raise EvaluationSetError(f"the engine's output is {tuple(logits.shape)}, not a segmenter's "
                                     f"{batch}×classes×H×W (2 to {MAX_CLASSES} classes)",
                                     fix="send postprocess segmentation only with a segmentation model")
        return np.argmax(logits[:real], axis=1).astype(np.uint8)

    masks, network, post = network_then_post(runner, data, batch, argmax)
    stacked = np.concatenate(masks)
    return {"artifact": evaluation.artifact, "images": evaluation.images, "top_k": 1, "batch_size": batch,
            "seconds": network + post, "masks": pack_masks(stacked), "mask_shape": list(stacked.shape),
            "network_s": network, "postprocess_s": post}


def frame_answer(job: dict[str, Any], evaluation, k: int = 5):
    """The ``segmentation`` post-processor's answer to a camera frame: the first image's mask (the argmax over
    classes, ``uint8``); two agree when every pixel does.

    Raises:
        EvaluationSetError: On the first frame, where the engine's output is not classes×H×W.
    """
    from device.jobs.frame import FrameAnswer

    def mask(outputs) -> np.ndarray:
        logits = np.asarray(outputs, dtype=np.float32)
        if logits.ndim != 4 or not 1 < logits.shape[1] <= MAX_CLASSES:
            raise EvaluationSetError(f"the engine's output is {tuple(logits.shape)}, not a segmenter's "
                                     f"N×classes×H×W (2 to {MAX_CLASSES} classes)",
                                     fix="send frame.postprocess segmentation only with a segmentation model")
        return np.argmax(logits[0], axis=0).astype(np.uint8)

    return FrameAnswer(mask, lambda a, b: bool(np.array_equal(a, b)))

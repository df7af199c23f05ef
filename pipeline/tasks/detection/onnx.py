"""Scoring an exported detector as the device runs it: ONNX Runtime to the raw head, then the device's own numpy
decode + NMS (:mod:`device.scoring.detection_post`), timed apart, then COCO mAP with intervals (:mod:`pipeline.tasks.detection.metrics`).

The export and quantize stages score every detection ONNX (FP32 and Q/DQ INT8) through here, so the mAP that gates
INT8 comes from the post-processing the agent runs, not from torchvision's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from device.scoring.detection_post import HeadSpec, load_head_spec, postprocess
from device.runners.onnxruntime import OnnxRuntimeRunner
from pipeline.tasks.detection.export import sidecar_path
from pipeline.tasks.detection.metrics import Boxes, accumulate, evaluate, match, require_sane_detector, summary


def onnx_detections(path: Path, inputs: np.ndarray, original_sizes: Sequence[tuple[int, int]],
                    spec: HeadSpec | None = None, batch_size: int = 32) -> tuple[list[Boxes], dict[str, float]]:
    """Detections of the ONNX at ``path`` on network inputs, with the network and the post-processing timed apart.

    Args:
        path: A detection ONNX (its sidecar beside it unless ``spec`` is given).
        inputs: float32 N×3×S×S (:func:`pipeline.tasks.detection.export.network_inputs`).
        original_sizes: Each image's (height, width), which the boxes are scaled back to.

    Returns:
        Per-image :class:`Boxes` (data class indices) and ``network_ms``/``postprocess_ms`` per image (host CPU).
    """
    spec = spec or load_head_spec(sidecar_path(path))
    detections, network, post = [], 0.0, 0.0
    with OnnxRuntimeRunner(path) as runner:
        for start in range(0, len(inputs), batch_size):
            began = time.perf_counter()
            raw = runner.infer(inputs[start:start + batch_size])
            middle = time.perf_counter()
            found = postprocess(spec, raw, original_sizes[start:start + batch_size])
            post += time.perf_counter() - middle
            network += middle - began
            detections.extend(Boxes(d["boxes"].astype(np.float64), d["labels"], d["scores"].astype(np.float64))
                              for d in found)
    images = max(1, len(inputs))
    return detections, {"network_ms": 1e3 * network / images, "postprocess_ms": 1e3 * post / images,
                        "batch_size": batch_size, "where": "build host, ONNX Runtime CPU"}


def score_onnx_detector(path: Path, inputs: np.ndarray, truth: Sequence[Boxes], classes: Sequence[str],
                        sizes: Sequence[tuple[int, int]], what: str, resamples: int = 200
                        ) -> tuple[dict[str, Any], list[Boxes]]:
    """COCO mAP/AP50/AP75 with intervals of an exported detector, after the sanity gates.

    Args:
        resamples: Bootstrap resamples for the intervals; 0 gives the point estimates alone (a parity check needs
            no interval, and the resamples are most of the time).

    Returns:
        The metrics (with ``timing``) and the detections (for per-class changes between rungs).

    Raises:
        StageError: The detector finds nothing or calls one class everywhere.
    """
    detections, timing = onnx_detections(path, inputs, sizes)
    require_sane_detector(detections, truth, classes, what)
    if not resamples:
        return {**summary(accumulate(match(truth, detections, len(classes)))), "images": len(truth),
                "timing": timing}, detections
    return {**evaluate(truth, detections, classes, sizes, resamples=resamples), "timing": timing}, detections

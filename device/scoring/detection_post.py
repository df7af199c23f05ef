"""A detector's post-processing without torch: decode the raw head outputs and run per-class NMS.

The exported detection graph ends at the raw head outputs — class logits and box deltas per anchor, concatenated
over levels into one ``N×A×K`` tensor — because torchvision's post-processing does not export cleanly and is the part
TensorRT should not quantize. Its JSON sidecar (:func:`load_head_spec`) carries what decoding needs: the anchors,
the box coder's kind and weights, how scores are made, and the recipe's thresholds. This module reproduces
torchvision's ``postprocess_detections`` (FCOS, RetinaNet, SSD) in numpy, so the agent runs and times what an
application would run after the engine. It needs only NumPy (and EdgeFold's errors where EdgeFold is installed):
``edgefold ship`` puts this file beside a shipped detector's ``infer.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

try:
    from device.errors import ConfigError
except ImportError:  # shipped alone beside an application (edgefold ship copies this file into its folder)
    class ConfigError(ValueError):  # noqa: N818 (EdgeFold's name)
        def __init__(self, message: str, fix: str | None = None):
            super().__init__(message)
            self.message, self.fix = message, fix

SCHEMA = "edgefold.detection_head/1"
SCORES = ("sigmoid", "sigmoid_centerness", "softmax", "probability", "objectness", "final")
CANDIDATES = ("per_level", "per_class", "per_box", "final")
CODERS = ("linear", "deltas", "cxcywh", "xyxy")
ANCHORED = ("linear", "deltas")
"""The box coders that decode against anchors (torchvision's); ``cxcywh`` and ``xyxy`` are boxes in the network
input's pixels already (YOLO's raw and end-to-end outputs)."""
RESIZES = ("stretch", "letterbox")


class HeadSpecError(ConfigError):
    """A detection sidecar that is missing, of another schema, or inconsistent with itself."""


@dataclass(frozen=True)
class Thresholds:
    """The recipe's post-processing: scores kept above ``score``, NMS at ``iou`` per class, ``max_detections`` per
    image, ``topk`` candidates per level (FCOS/RetinaNet) or per class (SSD) before NMS."""

    score: float
    iou: float
    max_detections: int
    topk: int


@dataclass(frozen=True)
class HeadSpec:
    """What decoding a raw head output needs (the sidecar beside the ONNX, as loaded).

    Attributes:
        num_classes: The model's class columns (SSD's include background at column 0).
        label_offset: Subtracted from a model label to give the data's class index (1 where 0 is background).
        layout: Column ranges of the ``N×A×K`` output: ``cls_logits``, ``bbox_regression`` and, for FCOS,
            ``bbox_ctrness``.
        score: ``sigmoid`` (RetinaNet), ``sigmoid_centerness`` (FCOS: √(σ(cls)·σ(ctr))), ``softmax`` (SSD),
            ``probability`` (YOLOv8/v11: class scores already through a sigmoid), ``objectness`` (YOLOv5/v7:
            objectness × class probability) or ``final`` (an end-to-end output's score column, read as it is).
        coder: ``{"kind": "linear", "normalize_by_size": bool}`` (FCOS), ``{"kind": "deltas", "weights": [4],
            "clip": float}`` (RetinaNet, SSD), ``{"kind": "cxcywh"}`` (YOLO: centre and size in input pixels) or
            ``{"kind": "xyxy"}`` (end-to-end: corners in input pixels).
        anchors: A×4 xyxy in the network input's pixels (0×4 for the anchor-free coders).
        anchors_per_level: How many anchors each level holds, in order (empty for the anchor-free coders).
        candidates: ``per_level`` (top-k over anchor × class per level), ``per_class`` (top-k per class),
            ``per_box`` (each box's best class, top-k over boxes: Ultralytics' ``multi_label=False``) or ``final``
            (an end-to-end output: no NMS).
        image_size: (height, width) the boxes are clipped to: the resized image inside the network input.
        thresholds: The recipe's thresholds.
        rows: A: the boxes (anchors) per image in the raw output.
        transpose: The raw output is ``N×K×A`` (YOLOv8/v11's layout), transposed before decoding.
        resize: How an image became the network's input: ``stretch`` (resized to the square) or ``letterbox``
            (Ultralytics': aspect kept, centred, padded with grey 114); boxes are mapped back accordingly.
    """

    num_classes: int
    label_offset: int
    layout: dict[str, tuple[int, int]]
    score: str
    coder: dict[str, Any]
    anchors: np.ndarray
    anchors_per_level: tuple[int, ...]
    candidates: str
    image_size: tuple[int, int]
    thresholds: Thresholds
    rows: int = 0
    transpose: bool = False
    resize: str = "stretch"

    @property
    def width(self) -> int:
        """K: the raw output's last dimension (after ``transpose``)."""
        return max(end for _, end in self.layout.values())


def head_spec_from_dict(data: dict[str, Any], where: str = "the detection sidecar") -> HeadSpec:
    """Builds and checks a :class:`HeadSpec` from the sidecar's JSON object.

    Raises:
        HeadSpecError: Another schema, a missing key, or values that contradict each other (named).
    """
    fix = "re-run the export stage (--force export), which writes the sidecar beside the ONNX"
    if data.get("schema") != SCHEMA:
        raise HeadSpecError(f"{where} has schema {data.get('schema')!r}, not {SCHEMA}", fix=fix)
    try:
        anchors = np.asarray(data["anchors"], dtype=np.float32).reshape(-1, 4)
        post = data["postprocess"]
        spec = HeadSpec(
            num_classes=int(data["num_classes"]), label_offset=int(data["label_offset"]),
            layout={k: (int(v[0]), int(v[1])) for k, v in data["layout"].items()}, score=str(data["score"]),
            coder=dict(data["box_coder"]), anchors=anchors,
            anchors_per_level=tuple(int(n) for n in data["anchors_per_level"]), candidates=str(data["candidates"]),
            image_size=(int(data["image_size"][0]), int(data["image_size"][1])),
            thresholds=Thresholds(float(post["score_threshold"]), float(post["iou_threshold"]),
                                  int(post["max_detections"]), int(post["topk_candidates"])),
            rows=int(data.get("rows", len(anchors))), transpose=bool(data.get("transpose", False)),
            resize=str(data.get("resize", "stretch")))
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise HeadSpecError(f"{where} is incomplete or malformed ({type(err).__name__}: {err})", fix=fix) from None
    problems = []
    if spec.score not in SCORES:
        problems.append(f"score {spec.score!r} is none of {SCORES}")
    if spec.candidates not in CANDIDATES:
        problems.append(f"candidates {spec.candidates!r} is none of {CANDIDATES}")
    if spec.coder.get("kind") not in CODERS:
        problems.append(f"box_coder kind {spec.coder.get('kind')!r} is none of {CODERS}")
    if spec.resize not in RESIZES:
        problems.append(f"resize {spec.resize!r} is none of {RESIZES}")
    if spec.coder.get("kind") in ANCHORED:
        if sum(spec.anchors_per_level) != len(spec.anchors):
            problems.append(f"anchors_per_level sums to {sum(spec.anchors_per_level)} but {len(spec.anchors)} "
                            "anchors")
        if spec.rows != len(spec.anchors):
            problems.append(f"rows {spec.rows} but {len(spec.anchors)} anchors")
    elif spec.rows < 1:
        problems.append(f"rows {spec.rows}: the raw output's boxes per image are needed for box_coder "
                        f"{spec.coder.get('kind')!r}")
    problems += _layout_problems(spec)
    if (spec.score == "final") != (spec.candidates == "final") or (spec.score == "final") != (
            spec.coder.get("kind") == "xyxy"):
        problems.append("score, candidates and box_coder are final/final/xyxy together (an end-to-end output) or "
                        "none of them")
    if problems:
        raise HeadSpecError(f"{where}: {'; '.join(problems)}", fix=fix)
    return spec


def _layout_problems(spec: HeadSpec) -> list[str]:
    """What is wrong with the sidecar's column layout for its score kind."""
    needed = {"final": ("bbox_regression", "scores", "labels"), "objectness": ("bbox_regression", "objectness",
                                                                             "cls_logits"),
              "sigmoid_centerness": ("bbox_regression", "cls_logits", "bbox_ctrness")}.get(
        spec.score, ("bbox_regression", "cls_logits"))
    missing = [key for key in needed if key not in spec.layout]
    if missing:
        return [f"layout lacks {', '.join(missing)} for score {spec.score!r}"]
    problems = []
    if "cls_logits" in spec.layout and spec.layout["cls_logits"][1] - spec.layout["cls_logits"][0] != spec.num_classes:
        problems.append(f"cls_logits spans {spec.layout['cls_logits']} for {spec.num_classes} classes")
    if spec.layout["bbox_regression"][1] - spec.layout["bbox_regression"][0] != 4:
        problems.append(f"bbox_regression spans {spec.layout['bbox_regression']}, not 4 columns")
    return problems


def load_head_spec(path: str | Path) -> HeadSpec:
    """Reads the sidecar JSON written beside a detection ONNX.

    Raises:
        HeadSpecError: Missing, not JSON, or not a valid sidecar.
    """
    path = Path(path)
    if not path.is_file():
        raise HeadSpecError(f"detection sidecar {path} does not exist",
                            fix="ship the .head.json the export stage wrote beside the ONNX with it")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HeadSpecError(f"detection sidecar {path} is not JSON ({err})", fix="re-run the export stage") from None
    return head_spec_from_dict(data, str(path))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def decode_boxes(deltas: np.ndarray, anchors: np.ndarray, coder: dict[str, Any]) -> np.ndarray:
    """Boxes (xyxy) from box regressions and their anchors, as torchvision's coders decode them.

    ``cxcywh`` (YOLO) and ``xyxy`` (end-to-end) are boxes already, in input pixels; ``anchors`` is not read.
    ``linear`` is ``BoxLinearCoder`` (FCOS: distances from the anchor's centre to the four edges, in units of the
    anchor's size when ``normalize_by_size``); ``deltas`` is ``BoxCoder.decode_single`` (centre shifts and log
    size ratios divided by ``weights``, the log ratios clipped at ``clip`` before ``exp``).
    """
    deltas = deltas.astype(np.float32, copy=False)
    if coder["kind"] == "xyxy":
        return deltas
    if coder["kind"] == "cxcywh":  # YOLO: no anchors, the centre and size in input pixels
        half = np.float32(0.5) * deltas[:, 2:4]
        return np.concatenate([deltas[:, 0:2] - half, deltas[:, 0:2] + half], axis=1)
    anchors = anchors.astype(np.float32, copy=False)
    widths, heights = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
    if coder["kind"] == "linear":
        cx, cy = 0.5 * (anchors[:, 0] + anchors[:, 2]), 0.5 * (anchors[:, 1] + anchors[:, 3])
        if coder.get("normalize_by_size", True):
            deltas = deltas * np.stack([widths, heights, widths, heights], axis=1)
        return np.stack([cx - deltas[:, 0], cy - deltas[:, 1], cx + deltas[:, 2], cy + deltas[:, 3]], axis=1)
    wx, wy, ww, wh = (np.float32(w) for w in coder["weights"])
    cx, cy = anchors[:, 0] + np.float32(0.5) * widths, anchors[:, 1] + np.float32(0.5) * heights
    clip = np.float32(coder.get("clip", math.log(1000.0 / 16)))
    dw, dh = np.minimum(deltas[:, 2] / ww, clip), np.minimum(deltas[:, 3] / wh, clip)
    px, py = deltas[:, 0] / wx * widths + cx, deltas[:, 1] / wy * heights + cy
    half_w, half_h = np.float32(0.5) * np.exp(dw) * widths, np.float32(0.5) * np.exp(dh) * heights
    return np.stack([px - half_w, py - half_h, px + half_w, py + half_h], axis=1)


def pairwise_iou(boxes: np.ndarray) -> np.ndarray:
    """IoU of every box with every other (xyxy), as ``torchvision.ops.box_iou`` computes it (areas w·h)."""
    x1, y1, x2, y2 = (boxes[:, i] for i in range(4))
    areas = (x2 - x1) * (y2 - y1)
    inter = (np.clip(np.minimum(x2[:, None], x2[None]) - np.maximum(x1[:, None], x1[None]), 0, None)
             * np.clip(np.minimum(y2[:, None], y2[None]) - np.maximum(y1[:, None], y1[None]), 0, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        return inter / (areas[:, None] + areas[None] - inter)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy NMS as ``torchvision.ops.nms``: highest score first, dropping boxes whose IoU with a kept one is
    above ``iou_threshold``. Returns the kept indices, highest score first.

    The IoU matrix is computed once and the greedy pass walks it (a detector's candidates per class are hundreds,
    so the matrix is small, and one vector operation per kept box replaces several).
    """
    order = np.argsort(-scores, kind="stable")
    over = pairwise_iou(boxes[order]) > iou_threshold  # a NaN IoU (two empty boxes) suppresses nothing, as torchvision
    suppressed = np.zeros(len(order), bool)
    keep = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= over[i]
    return order[np.asarray(keep, dtype=np.int64)]


def batched_nms(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, iou_threshold: float) -> np.ndarray:
    """NMS within each class (``torchvision.ops.batched_nms``); kept indices sorted by score, highest first."""
    keep = [np.flatnonzero(labels == k)[nms(boxes[labels == k], scores[labels == k], iou_threshold)]
            for k in np.unique(labels)]
    if not keep:
        return np.zeros(0, np.int64)
    keep = np.concatenate(keep)
    return keep[np.argsort(-scores[keep], kind="stable")]


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-scores, kind="stable")[:k]


def _candidates(spec: HeadSpec, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image's scored candidates before NMS: boxes (network pixels, clipped), scores, model labels."""
    height, width = spec.image_size
    limits = np.array([width, height, width, height], np.float32)

    def clip(boxes: np.ndarray) -> np.ndarray:
        return np.clip(boxes, 0, limits)

    if spec.candidates in ("per_box", "final"):
        return _box_candidates(spec, raw)
    t = spec.thresholds
    (c0, c1), (b0, b1) = spec.layout["cls_logits"], spec.layout["bbox_regression"]
    logits, deltas = raw[:, c0:c1], raw[:, b0:b1]
    if spec.candidates == "per_class":  # SSD: decode every anchor, then top-k per class above the threshold
        scores = _softmax(logits) if spec.score == "softmax" else _sigmoid(logits)
        boxes = clip(decode_boxes(deltas, spec.anchors, spec.coder))
        picked_boxes, picked_scores, picked_labels = [], [], []
        first = 1 if spec.score == "softmax" else 0  # softmax column 0 is the background
        for label in range(first, spec.num_classes):
            index = np.flatnonzero(scores[:, label] > t.score)
            index = index[_top(scores[index, label], t.topk)]
            picked_boxes.append(boxes[index])
            picked_scores.append(scores[index, label])
            picked_labels.append(np.full(len(index), label, np.int64))
        return np.concatenate(picked_boxes), np.concatenate(picked_scores), np.concatenate(picked_labels)
    # FCOS / RetinaNet: per level, top-k over (anchor, class) pairs above the threshold, then decode only those.
    scores = _sigmoid(logits)
    if spec.score == "sigmoid_centerness":
        d0, d1 = spec.layout["bbox_ctrness"]
        scores = np.sqrt(scores * _sigmoid(raw[:, d0:d1]))
    picked_boxes, picked_scores, picked_labels, start = [], [], [], 0
    for count in spec.anchors_per_level:
        level = scores[start:start + count].reshape(-1)
        index = np.flatnonzero(level > t.score)
        index = index[_top(level[index], t.topk)]
        anchor = index // spec.num_classes + start
        picked_boxes.append(clip(decode_boxes(deltas[anchor], spec.anchors[anchor], spec.coder)))
        picked_scores.append(level[index])
        picked_labels.append(index % spec.num_classes)
        start += count
    return np.concatenate(picked_boxes), np.concatenate(picked_scores), np.concatenate(picked_labels)


def _box_candidates(spec: HeadSpec, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """YOLO's candidates: each box's best class above the threshold (Ultralytics' ``non_max_suppression`` with
    ``multi_label=False``; YOLOv5/v7 first drop boxes whose objectness is at or below it, then score objectness ×
    class probability), the ``topk`` best; or an end-to-end output's rows above the threshold, as they are. Not
    clipped: Ultralytics runs NMS on the boxes as decoded and clips after (:func:`postprocess`)."""
    t = spec.thresholds
    (b0, b1) = spec.layout["bbox_regression"]
    if spec.candidates == "final":
        (s0, _), (l0, _) = spec.layout["scores"], spec.layout["labels"]
        scores = raw[:, s0]
        index = np.flatnonzero(scores > t.score)
        index = index[_top(scores[index], t.max_detections)]
        return raw[index, b0:b1], scores[index], np.rint(raw[index, l0]).astype(np.int64)
    (c0, c1) = spec.layout["cls_logits"]
    rows = np.arange(len(raw))
    probabilities = raw[:, c0:c1]
    if spec.score == "objectness":
        objectness = raw[:, spec.layout["objectness"][0]]
        rows = np.flatnonzero(objectness > t.score)
        probabilities = probabilities[rows] * objectness[rows, None]
    labels = np.argmax(probabilities, axis=1) if len(rows) else np.zeros(0, np.int64)
    best = probabilities[np.arange(len(rows)), labels]
    index = np.flatnonzero(best > t.score)
    index = index[_top(best[index], t.topk)]
    boxes = decode_boxes(raw[rows[index], b0:b1], spec.anchors, spec.coder)
    return boxes, best[index], labels[index].astype(np.int64)


def _to_originals(spec: HeadSpec, boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    """Boxes in network pixels → the original image's pixels: undo the stretch, or the letterbox's scale and
    centring padding (Ultralytics' ``scale_boxes``: the padding rounded as its ``LetterBox`` rounds it), then clip."""
    net_h, net_w = spec.image_size
    if spec.resize == "stretch":
        return boxes * np.array([width / net_w, height / net_h] * 2, np.float32)
    gain = min(net_h / height, net_w / width)
    pad_x, pad_y = round((net_w - width * gain) / 2 - 0.1), round((net_h - height * gain) / 2 - 0.1)
    boxes = (boxes - np.array([pad_x, pad_y, pad_x, pad_y], np.float32)) / np.float32(gain)
    return np.clip(boxes, 0, np.array([width, height, width, height], np.float32))


def postprocess(spec: HeadSpec, raw: np.ndarray, original_sizes: Sequence[tuple[int, int]] | None = None
                ) -> list[dict[str, np.ndarray]]:
    """Detections per image from the raw head output, as torchvision's detector returns them.

    Args:
        spec: The sidecar.
        raw: ``N×A×K`` float32, the network's one output (``N×K×A`` where the sidecar says ``transpose``).
        original_sizes: Each image's (height, width) before it was resized to the network's input; boxes are
            scaled back to it (default: the network's own size, no scaling).

    Returns:
        Per image ``boxes`` (M×4 xyxy, float32), ``scores`` (M) and ``labels`` (M, the data's class index), highest
        score first, at most ``max_detections``.

    Raises:
        HeadSpecError: ``raw`` does not have the sidecar's anchors and columns.
    """
    raw = np.asarray(raw, dtype=np.float32)
    expected = (spec.width, spec.rows) if spec.transpose else (spec.rows, spec.width)
    if raw.ndim != 3 or tuple(raw.shape[1:]) != expected:
        raise HeadSpecError(f"raw head output of shape {raw.shape} does not fit the sidecar's N×{expected[0]}"
                            f"×{expected[1]}", fix="use the sidecar written beside this very ONNX")
    if spec.transpose:
        raw = raw.transpose(0, 2, 1)
    out = []
    for index, image in enumerate(raw):
        boxes, scores, labels = _candidates(spec, image)
        keep = np.arange(len(scores)) if spec.candidates == "final" else \
            batched_nms(boxes, scores, labels, spec.thresholds.iou)[: spec.thresholds.max_detections]
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        if spec.candidates in ("per_box", "final"):  # YOLO's: clipped after NMS, to the network's input
            height, width = spec.image_size
            boxes = np.clip(boxes, 0, np.array([width, height, width, height], np.float32))
        if original_sizes is not None:
            boxes = _to_originals(spec, boxes, *original_sizes[index])
        out.append({"boxes": boxes.astype(np.float32), "scores": scores.astype(np.float32),
                    "labels": labels.astype(np.int64) - spec.label_offset})
    return out

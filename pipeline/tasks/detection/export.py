"""A detector exported up to its raw head outputs, with the JSON sidecar the device decodes them with.

torchvision's detectors end in post-processing (score thresholds, top-k, NMS, rescaling) that does not go through
``torch.export`` cleanly and that TensorRT should not quantize; so the graph stops at the head: one output ``head``,
``N×A×K``, the class logits, box regressions and (FCOS) centerness of every anchor, concatenated over levels and
then over columns (one output, so every runner's ``infer`` returns all of it). Normalisation (the detector's
``image_mean``/``image_std``) is inside the graph; the input is the image in [0, 1], resized to the detector's
square input. The sidecar (:mod:`device.scoring.detection_post` reads it, without torch) records the anchors, the box
coder's weights, how scores are formed and the recipe's thresholds.
"""

from __future__ import annotations

import json
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from device.scoring.detection_post import SCHEMA, head_spec_from_dict
from device.errors import ConfigError

INPUT_NAME, OUTPUT_NAME = "input", "head"
BOX_BRANCH = "head.regression_head"
"""The module every registered detector's box-regression branch lives under (FCOS's centerness is in it too)."""


class RawHead(nn.Module):
    """A torchvision detector from normalisation to the concatenated raw head outputs (no post-processing)."""

    def __init__(self, detector: nn.Module):
        super().__init__()
        self.detector = detector
        transform = detector.transform
        self.register_buffer("mean", torch.tensor(transform.image_mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(transform.image_std, dtype=torch.float32).view(1, -1, 1, 1))

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The feature maps the head reads, from an image batch in [0, 1]."""
        features = self.detector.backbone((x - self.mean) / self.std)
        if isinstance(features, torch.Tensor):
            features = OrderedDict([("0", features)])
        return list(features.values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.detector.head(self.features(x))
        return torch.cat([out[key] for key in head_columns(self.detector)], dim=2)


def head_columns(detector: nn.Module) -> tuple[str, ...]:
    """The head outputs concatenated, in order."""
    from torchvision.models.detection.fcos import FCOS

    return ("cls_logits", "bbox_regression") + (("bbox_ctrness",) if isinstance(detector, FCOS) else ())


def check_exportable(detector: nn.Module, size: int) -> None:
    """The exported graph takes a square ``size`` image with no padding: refuse a size the transform would pad.

    Raises:
        ConfigError: ``size`` is not a multiple of the transform's ``size_divisible``.
    """
    divisible = getattr(detector.transform, "size_divisible", 1)
    if size % divisible:
        raise ConfigError(f"the detector pads its {size}-px input to a multiple of {divisible}; the exported graph "
                          "takes an unpadded square image",
                          fix=f"set teacher.input_size to a multiple of {divisible}")


def network_inputs(images: np.ndarray, size: int, channel_order: str = "rgb", input_range: str = "0-1") -> np.ndarray:
    """N×H×W (grey) or N×H×W×3 uint8 images → float32 N×3×size×size in [0, 1], resized as torchvision's transform
    resizes a square image (bilinear, ``align_corners=False``), not yet normalised (the graph does it).

    Args:
        channel_order: ``bgr`` for a detector brought as ONNX that was trained on BGR images.
        input_range: ``0-255`` for one whose graph takes the pixel values as they are (YOLOX's, for one).
    """
    from pipeline.tasks.detection.train import image_tensors

    x = image_tensors(images)
    if tuple(x.shape[-2:]) != (size, size):
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.flip(1) if channel_order == "bgr" else x
    return (x * 255 if input_range == "0-255" else x).numpy().astype(np.float32)


def feed_of(sidecar: dict[str, Any]) -> dict[str, str]:
    """The :func:`network_inputs` keywords a rung's sidecar asks for (EdgeFold's own detectors: the defaults)."""
    return {"channel_order": sidecar.get("channel_order", "rgb"), "input_range": sidecar.get("input_range", "0-1")}


def _postprocess_config(detector: nn.Module, overrides: dict[str, Any]) -> dict[str, Any]:
    own = {"score_threshold": float(detector.score_thresh), "iou_threshold": float(detector.nms_thresh),
           "max_detections": int(detector.detections_per_img), "topk_candidates": int(detector.topk_candidates)}
    return {**own, **{k: v for k, v in overrides.items() if v is not None}}


def head_sidecar(detector: nn.Module, arch: str, size: int, label_offset: int,
                 postprocess: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sidecar for ``detector`` at a square input ``size``: anchors, coder, scores, layout and thresholds.

    Args:
        postprocess: The recipe's ``score_threshold``/``iou_threshold``/``max_detections``/``topk_candidates``;
            a key left out or None keeps the detector's own value.
    """
    from torchvision.models.detection.fcos import FCOS
    from torchvision.models.detection.ssd import SSD
    from torchvision.models.detection.image_list import ImageList

    detector = detector.eval()
    wrapper = RawHead(detector)
    x = torch.zeros(1, 3, size, size)
    with torch.no_grad():
        features = wrapper.features(x)
        anchors = detector.anchor_generator(ImageList(x, [(size, size)]), features)[0]
        raw = detector.head(features)
    columns, layout, start = head_columns(detector), {}, 0
    for key in columns:
        layout[key] = [start, start + int(raw[key].shape[-1])]
        start = layout[key][1]
    coder = detector.box_coder
    if isinstance(detector, FCOS):
        box_coder = {"kind": "linear", "normalize_by_size": bool(coder.normalize_by_size)}
        score, candidates = "sigmoid_centerness", "per_level"
    else:
        box_coder = {"kind": "deltas", "weights": [float(w) for w in coder.weights], "clip": float(coder.bbox_xform_clip)}
        score, candidates = ("softmax", "per_class") if isinstance(detector, SSD) else ("sigmoid", "per_level")
    per_location = detector.anchor_generator.num_anchors_per_location()
    per_level = [int(f.shape[-2] * f.shape[-1]) * int(n) for f, n in zip(features, per_location)]
    sidecar = {
        "schema": SCHEMA, "arch": arch, "input": INPUT_NAME, "output": OUTPUT_NAME,
        "input_shape": [3, size, size], "image_size": [size, size],
        "input_note": "RGB in [0, 1] (grey repeated to 3 channels), resized bilinearly to the input; normalised "
                      "inside the graph",
        "mean": list(detector.transform.image_mean), "std": list(detector.transform.image_std),
        "num_classes": layout["cls_logits"][1] - layout["cls_logits"][0], "label_offset": int(label_offset),
        "layout": layout, "score": score, "box_coder": box_coder, "candidates": candidates,
        "strides": [size // int(f.shape[-1]) for f in features], "anchors_per_level": per_level,
        "anchors": anchors.float().numpy().astype(float).tolist(),  # float32 values, exactly
        "postprocess": _postprocess_config(detector, postprocess or {}),
    }
    head_spec_from_dict(sidecar, f"the {arch} sidecar")  # what the device will check, checked before writing
    return sidecar


def export_detector(detector: nn.Module, path: Path, arch: str, size: int, label_offset: int, opset: int,
                    postprocess: dict[str, Any] | None = None) -> dict[str, Any]:
    """Writes ``path`` (ONNX to the raw head, dynamic batch, BatchNorm folded) and ``<stem>.head.json`` beside it.

    Returns:
        Facts about the graph (nodes, Conv/BatchNorm counts, opset, size) and the sidecar's path.
    """
    import onnx

    check_exportable(detector, size)
    wrapper = RawHead(detector.eval().cpu()).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter is chosen on purpose: it folds BatchNorm into Conv
        torch.onnx.export(wrapper, (torch.zeros(1, 3, size, size),), str(path), dynamo=False, opset_version=opset,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}}, do_constant_folding=True)
    graph = onnx.load(str(path))
    onnx.checker.check_model(graph, full_check=True)
    sidecar = sidecar_path(path)
    sidecar.write_text(json.dumps(head_sidecar(detector, arch, size, label_offset, postprocess)) + "\n")
    ops = [node.op_type for node in graph.graph.node]
    return {"nodes": len(ops), "batchnorm_nodes": ops.count("BatchNormalization"), "conv_nodes": ops.count("Conv"),
            "box_branch_nodes": len(box_branch_nodes(path)), "opset": opset, "size_mb": path.stat().st_size / 1e6,
            "sidecar": sidecar.name}


def sidecar_path(onnx_path: Path) -> Path:
    """``model.onnx`` → ``model.head.json`` (``student.int8.onnx`` → ``student.int8.head.json``)."""
    return onnx_path.with_name(onnx_path.name.removesuffix(".onnx") + ".head.json")


def box_branch_nodes(path: Path) -> list[str]:
    """The ONNX nodes of the box-regression branch, which INT8 leaves in float unless the recipe says otherwise.

    For a detector of EdgeFold's registry the legacy exporter names nodes by module scope
    (``/head/regression_head/...``, the wrapper's own attribute left out); for a YOLO-layout graph brought as ONNX
    (its sidecar's coder decodes no anchors) the branch is traced from the graph
    (:func:`pipeline.tasks.detection.box_branch.traced_box_branch`).
    """
    import onnx

    from device.scoring.detection_post import ANCHORED

    model = onnx.load(str(path), load_external_data=False)
    sidecar = sidecar_path(path)
    head = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    if head.get("box_coder", {}).get("kind", "linear") not in ANCHORED:
        from pipeline.tasks.detection.box_branch import traced_box_branch

        return traced_box_branch(model, columns_last=not head.get("transpose", False))
    scope = "/" + BOX_BRANCH.replace(".", "/") + "/"
    return [node.name for node in model.graph.node if node.name.startswith((scope, "/detector" + scope))]


def raw_outputs(detector: nn.Module, inputs: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """The raw head output torch computes for network inputs (the reference the ONNX is checked against)."""
    wrapper = RawHead(detector.eval()).eval()
    with torch.no_grad():
        return np.concatenate([wrapper(torch.from_numpy(inputs[i:i + batch_size])).numpy()
                               for i in range(0, len(inputs), batch_size)])

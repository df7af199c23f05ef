"""YOLO-layout detectors built here, never downloaded: a tiny FCOS trained on digits canvases, wrapped so that its
ONNX export has the output Ultralytics writes for YOLOv8/11 (``N×(4+C)×A``), YOLOv5/7 (``N×A×(5+C)``) or an
end-to-end model (``N×D×6``), with the same decode in the graph (boxes in input pixels, scores through a sigmoid)
and the Concat where the box and score columns meet, as Ultralytics' heads write it.

And an independent decode of those raw outputs (torchvision's NMS, not EdgeFold's), for the tests to check the
device's post-processing and the ladder's mAP against.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

SIZE, CLASSES = 64, 10
CANVAS = dict(size=SIZE, objects=(1, 3), scale=(0.25, 0.45), max_iou=0.1, texture=0.2)
"""tiny-det's canvases: the run's data stage draws the same kind."""


class YoloLayout(nn.Module):
    """A torchvision FCOS whose graph ends as a YOLO export does: decoded boxes and probabilities, one output."""

    def __init__(self, detector: nn.Module, layout: str, keep: int = 64):
        super().__init__()
        from torchvision.models.detection.image_list import ImageList

        self.detector, self.layout, self.keep = detector.eval(), layout, keep
        x = torch.zeros(1, 3, SIZE, SIZE)
        with torch.no_grad():
            features = list(detector.backbone(x).values())
            anchors = detector.anchor_generator(ImageList(x, [(SIZE, SIZE)]), features)[0]
        self.register_buffer("centres", 0.5 * (anchors[:, :2] + anchors[:, 2:]))
        self.register_buffer("sizes", anchors[:, 2:] - anchors[:, :2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = self.detector.head(list(self.detector.backbone(x).values()))
        deltas = head["bbox_regression"] * torch.cat([self.sizes, self.sizes], dim=1)  # FCOS: ltrb × anchor size
        top_left, bottom_right = self.centres - deltas[..., :2], self.centres + deltas[..., 2:]
        centre, extent = 0.5 * (top_left + bottom_right), bottom_right - top_left
        classes, objectness = torch.sigmoid(head["cls_logits"]), torch.sigmoid(head["bbox_ctrness"])
        if self.layout == "yolov8":  # Detect._inference: cat((dbox, cls.sigmoid()), 1), channels first
            scores = torch.sqrt(classes * objectness)
            return torch.cat([torch.cat([centre, extent], dim=2).transpose(1, 2), scores.transpose(1, 2)], dim=1)
        if self.layout == "yolov5":  # Detect.forward: cat((xy, wh, conf), 4), columns last
            return torch.cat([centre, extent, objectness, classes], dim=2)
        # end2end, as Ultralytics' Detect writes it: corners and scores in one N×(4+C)×A tensor, then the best
        # boxes gathered from it (Detect.postprocess), no NMS after.
        scores = torch.sqrt(classes * objectness)
        joined = torch.cat([torch.cat([top_left, bottom_right], dim=2).transpose(1, 2), scores.transpose(1, 2)], dim=1)
        boxes, scores = joined.permute(0, 2, 1).split([4, scores.shape[2]], dim=-1)
        best, label = scores.max(dim=2)
        top, index = best.topk(self.keep, dim=1)
        corners = torch.gather(boxes, 1, index[..., None].expand(-1, -1, 4))
        return torch.cat([corners, top[..., None], torch.gather(label, 1, index)[..., None].float()], dim=2)


def trained_fcos(train_images: int = 1024, epochs: int = 5) -> nn.Module:
    """tiny_fcos trained on digits canvases (about 20 s on two cores): mAP well above zero, the plumbing's figures."""
    from pipeline.core.recipe import TrainConfig
    from pipeline.tasks.detection.data import CanvasSpec, composited
    from pipeline.tasks.detection.models import build_detector
    from pipeline.tasks.detection.train import train_detector

    data = composited("digits", train_images, 16, CanvasSpec(seed=1, **CANVAS))
    torch.manual_seed(0)
    model = build_detector("tiny_fcos", CLASSES, SIZE)
    train_detector(model, data.train, TrainConfig(epochs=epochs, batch_size=32, lr=0.01, weight_decay=0.01,
                                                  schedule="onecycle", grad_clip=10.0))
    return model.eval()


class PixelValues(nn.Module):
    """A graph that takes pixel values 0–255 (YOLOX's feed), the same network inside."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x / 255)


def export_layout(detector: nn.Module, layout: str, path: Path, opset: int = 17, dynamic: bool = True,
                  pixel_values: bool = False) -> Path:
    """The wrapped detector exported as Ultralytics exports (input ``images``, output ``output0``); with
    ``pixel_values`` its graph takes 0–255."""
    import warnings

    wrapped = YoloLayout(detector, layout)
    wrapped = PixelValues(wrapped) if pixel_values else wrapped
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, (torch.zeros(1, 3, SIZE, SIZE),), str(path), dynamo=False,
                          opset_version=opset, input_names=["images"], output_names=["output0"],
                          dynamic_axes={"images": {0: "batch"}, "output0": {0: "batch"}} if dynamic else None)
    return path


def independent_decode(raw: np.ndarray, layout: str, conf: float = 0.25, iou: float = 0.7, max_det: int = 300
                       ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(boxes xyxy, scores, labels) per image from a YOLO raw output, as Ultralytics' ``non_max_suppression``
    (``multi_label=False``) decodes it, with torchvision's ``batched_nms``; boxes clipped to the input after NMS, as
    its ``scale_boxes`` does."""
    from torchvision.ops import batched_nms

    out = []
    for image in np.asarray(raw, np.float32):
        if layout == "end2end":
            kept = image[image[:, 4] > conf][:max_det]
            out.append((np.clip(kept[:, :4], 0, SIZE), kept[:, 4], np.rint(kept[:, 5]).astype(np.int64)))
            continue
        rows = image.T if layout == "yolov8" else image
        if layout == "yolov5":
            rows = rows[rows[:, 4] > conf]
            probabilities = rows[:, 5:] * rows[:, 4:5]
        else:
            probabilities = rows[:, 4:]
        labels = probabilities.argmax(1)
        scores = probabilities[np.arange(len(rows)), labels]
        chosen = scores > conf
        xywh, scores, labels = rows[chosen, :4], scores[chosen], labels[chosen]
        boxes = np.concatenate([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], 1)
        keep = batched_nms(torch.from_numpy(boxes), torch.from_numpy(scores), torch.from_numpy(labels), iou)
        keep = keep[:max_det].numpy()
        out.append((np.clip(boxes[keep], 0, SIZE), scores[keep], labels[keep]))
    return out


REG_MAX = 16
"""Ultralytics' DFL bins per box side (``Detect.reg_max``)."""


class UltralyticsDetect(nn.Module):
    """The trained FCOS behind a head laid out as Ultralytics 8.4's ``Detect`` exports it (YOLOv8, YOLO11):

    - per level, a box branch of ``4 × REG_MAX`` DFL logits and a class branch of logits (``cv2``, ``cv3``), joined
      along channels, flattened and concatenated over levels;
    - the anchor points (grid centres, +0.5) and each anchor's stride computed inside the graph from the feature
      maps' shapes (``Shape`` → ``Range`` … and a ``ConstantOfShape``-like fill of the stride), so a free height and
      width move them;
    - DFL: a softmax over the bins of each side and a 1×1 convolution with weights 0…15; ``dist2bbox`` to centre and
      size in stride units; × the strides; ``cat((dbox, cls.sigmoid()), 1)``: one ``N×(4+C)×A`` output.

    The FCOS's own answers are carried over: each side's distance (FCOS's regression, in units of the level's anchor
    size, which is its stride, from an anchor centre half a stride off Ultralytics') is written as DFL logits whose
    expectation is that distance, and the class logit is that of FCOS's score ``√(σ(cls)·σ(ctr))``.
    """

    def __init__(self, detector: nn.Module):
        super().__init__()
        self.detector = detector.eval()
        self.strides = (8, 16)  # tiny_fcos's levels
        self.register_buffer("bins", torch.arange(REG_MAX, dtype=torch.float32))
        self.dfl = nn.Conv2d(REG_MAX, 1, 1, bias=False).requires_grad_(False)
        self.dfl.weight.data[:] = torch.arange(REG_MAX, dtype=torch.float32).view(1, REG_MAX, 1, 1)

    def _branches(self, feature: torch.Tensor) -> torch.Tensor:
        """One level's ``cat(cv2(x), cv3(x))``: N×(4·REG_MAX + C)×H×W."""
        head = self.detector.head
        n, _, h, w = feature.shape
        logits = head.classification_head([feature])  # N×(H·W)×C
        regression, centerness = head.regression_head([feature])  # N×(H·W)×4, N×(H·W)×1
        score = torch.sqrt(torch.sigmoid(logits) * torch.sigmoid(centerness)).clamp(1e-6, 1 - 1e-6)
        classes = torch.log(score / (1 - score))
        shift = torch.tensor([0.5, 0.5, -0.5, -0.5], device=feature.device)  # FCOS's centre at i·s, theirs (i+½)·s
        distance = (regression + shift).clamp(0, REG_MAX - 1)  # ltrb, stride units
        dfl = -((self.bins - distance[..., None]) ** 2) / (2 * 0.6 ** 2)  # N×(H·W)×4×REG_MAX, mean ≈ distance
        box = dfl.flatten(2).transpose(1, 2).reshape(n, 4 * REG_MAX, h, w)
        return torch.cat([box, classes.transpose(1, 2).reshape(n, -1, h, w)], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = list(self.detector.backbone(x).values())
        levels = [self._branches(f) for f in features]
        n = x.shape[0]
        columns = levels[0].shape[1]
        joined = torch.cat([level.view(n, columns, -1) for level in levels], dim=2)
        points, strides = [], []
        for feature, stride in zip(features, self.strides):  # make_anchors, from the shapes
            h, w = feature.shape[2], feature.shape[3]
            xs = torch.arange(w, dtype=torch.float32) + 0.5
            ys = torch.arange(h, dtype=torch.float32) + 0.5
            gy, gx = torch.meshgrid(ys, xs, indexing="ij")
            points.append(torch.stack((gx, gy), -1).view(-1, 2))
            strides.append(torch.full((h * w, 1), float(stride)))
        anchors, stride = torch.cat(points).transpose(0, 1), torch.cat(strides).transpose(0, 1)
        box, classes = joined.split((4 * REG_MAX, columns - 4 * REG_MAX), 1)
        anchors_count = box.shape[2]
        sides = self.dfl(box.view(n, 4, REG_MAX, anchors_count).transpose(2, 1).softmax(1)).view(n, 4, anchors_count)
        left_top, right_bottom = sides.chunk(2, 1)
        top_left, bottom_right = anchors.unsqueeze(0) - left_top, anchors.unsqueeze(0) + right_bottom
        dbox = torch.cat(((top_left + bottom_right) / 2, bottom_right - top_left), 1) * stride
        return torch.cat((dbox, classes.sigmoid()), 1)


class UltralyticsNMS(nn.Module):
    """Ultralytics 8.4's ``nms=True`` export around :class:`UltralyticsDetect`: per image, the best class of each box
    over a score threshold, torchvision's NMS on class-offset boxes, and the kept rows written into a zero
    ``N×MAX_DET×6`` tensor (x1, y1, x2, y2, score, class). Its loop runs over the batch it was traced at (1): at a
    larger batch only the first image is answered, the others stay zero — what the outside test saw."""

    MAX_DET = 50

    def __init__(self, detector: nn.Module, conf: float = 0.05, iou: float = 0.7):
        super().__init__()
        self.model, self.conf, self.iou = UltralyticsDetect(detector), conf, iou

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchvision.ops import nms

        pred = self.model(x).transpose(-1, -2)
        traced_batch = pred.shape[0]
        boxes, scores = pred.split([4, pred.shape[2] - 4], dim=2)
        scores, classes = scores.max(dim=-1)
        out = pred.new_zeros(pred.shape[0], self.MAX_DET, 6)
        for i in range(traced_batch):  # an int while tracing: the loop is unrolled at the traced batch
            keep_mask = scores[i] > self.conf
            box, score, label = boxes[i][keep_mask], scores[i][keep_mask], classes[i][keep_mask]
            corners = torch.cat([box[:, :2] - box[:, 2:] / 2, box[:, :2] + box[:, 2:] / 2], 1)
            offset = corners + label[:, None].float() * 4096
            keep = nms(offset, score, self.iou)[: self.MAX_DET]
            rows = torch.cat([corners[keep], score[keep, None], label[keep, None].float()], 1)
            out[i] = nn.functional.pad(rows.reshape(-1), (0, (self.MAX_DET - rows.shape[0]) * 6)).view(self.MAX_DET, 6)
        return out


def export_ultralytics(detector: nn.Module, path: Path, dynamic: bool = True, nms: bool = False,
                       opset: int = 18, size: int = SIZE) -> Path:
    """:class:`UltralyticsDetect` (or with ``nms``, :class:`UltralyticsNMS`) exported as Ultralytics 8.4's
    ``export(format="onnx")`` writes it: input ``images``, output ``output0``, opset 18, slimmed by onnxslim;
    ``dynamic=True`` frees batch, height and width (with ``nms`` only the batch), ``dynamic=False`` fixes batch 1
    inside the graph's reshapes; traced at batch 1, and Ultralytics' metadata (``imgsz``, ``names``, ``stride``) in
    the file."""
    import warnings

    import onnx

    wrapped = UltralyticsNMS(detector) if nms else UltralyticsDetect(detector)
    axes = None
    if dynamic:
        axes = {"images": {0: "batch"} if nms else {0: "batch", 2: "height", 3: "width"},
                "output0": {0: "batch"} if nms else {0: "batch", 2: "anchors"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped.eval(), (torch.zeros(1, 3, size, size),), str(path), dynamo=False,
                          opset_version=opset, input_names=["images"], output_names=["output0"], dynamic_axes=axes)
    import onnxslim

    model = onnxslim.slim(onnx.load(str(path)))  # as Ultralytics does after every ONNX export: constants folded
    for key, value in {"imgsz": f"[{size}, {size}]", "stride": "16", "task": "detect", "batch": "1",
                       "names": repr({i: str(i) for i in range(CLASSES)}), "author": "Ultralytics"}.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
    return path


def yolo_recipe(path, **sections) -> dict:
    """The test recipe of a YOLOv8-layout file: tiny-det's canvases, the ladder's cheapest settings."""
    return {"name": "yolo-start", "task": "detection",
            "data": {"source": "digits-det", "train_images": 256, "test_images": 64,
                     "canvas": {**CANVAS, "objects": list(CANVAS["objects"]), "scale": list(CANVAS["scale"])}},
            "start": {"onnx": str(path), "outputs": "yolov8"}, "postprocess": {"score_threshold": 0.05},
            # The tiny detector's mAP is a few points: the budget tests the plumbing, not the method.
            "quantize": {"calibration_methods": ["max"], "resamples": 50, "calib_images": 64,
                         "accuracy_budget_points": 10.0},
            "deploy": {"idle_s": 0.1, "rounds": 1, "iterations": 5, "warmup_iterations": 1, "resamples": 50},
            **sections}


def planted_outlier(path: Path, out: Path, node_name: str, gain: float = 400.0) -> Path:
    """``path``'s graph with one convolution made sensitive to INT8, its float answers unchanged: the input's first
    channel times ``gain`` (a Mul in front, not a quantized op) and that channel's weights divided by it, so the
    per-tensor INT8 range of that one input leaves the other channels a level or none (as
    tests/pipeline/quantize/test_mixed_precision.py plants a classifier's)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    node = next(n for n in graph.node if n.name == node_name)
    weights = {t.name: t for t in graph.initializer}
    kernel = numpy_helper.to_array(weights[node.input[1]]).copy()
    kernel[:, 0] /= gain
    scale = np.ones((1, kernel.shape[1], 1, 1), np.float32)
    scale[0, 0] = gain
    graph.initializer.extend([numpy_helper.from_array(kernel, f"{node_name}/planted_weight"),
                              numpy_helper.from_array(scale, f"{node_name}/planted_gain")])
    graph.node.insert(list(graph.node).index(node), helper.make_node(
        "Mul", [node.input[0], f"{node_name}/planted_gain"], [f"{node_name}/planted_input"], name=f"{node_name}/Planted"))
    node.input[0], node.input[1] = f"{node_name}/planted_input", f"{node_name}/planted_weight"
    onnx.save(model, str(out))
    return out

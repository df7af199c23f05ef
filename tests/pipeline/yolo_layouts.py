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

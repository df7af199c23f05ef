"""Segmentation's part of ``edgefold ship`` (:class:`pipeline.ship.task.ShipTask`): mIoU from the report's rows, the
class names and their colours, the argmax ``infer.py`` turns the logits into a mask with, and ``nvinfer``'s own
segmentation output.

The network was fed the whole image stretched to its square (bilinear, RGB in 0–1), which is what ``nvinfer`` does
with ``maintain-aspect-ratio=0``: its feed differs from EdgeFold's only in the scaling filter. DeepStream:
``network-type=2`` — nvinfer takes the argmax itself and attaches the class map (``NvDsInferSegmentationMeta``), which
``nvsegvisual`` draws; a pixel takes a class only where its value exceeds ``segmentation-threshold``, so the shipped
graph ends in a Softmax (probabilities, all above 0) and the threshold is 0: every pixel gets its argmax, as mIoU
counted it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import ManifestError
from pipeline.ship.task import ShipRow, scored_rows

CARD_FIGURES = ("latency_p99_ms", "throughput_images_per_s", "energy_mj_per_image", "power_mean_w", "peak_memory_mb",
                "frame_total_ms", "frame_fps_pipelined", "sustained_ratio")


def palette(count: int) -> list[list[int]]:
    """The PASCAL VOC colour map (each class index's bits spread over R, G and B), the one VOC's and torchvision's
    mask PNGs use: class 0 black, 1 dark red, 2 dark green, …"""
    colours = []
    for index in range(count):
        red = green = blue = 0
        value = index
        for bit in range(8):
            red |= ((value >> 0) & 1) << (7 - bit)
            green |= ((value >> 1) & 1) << (7 - bit)
            blue |= ((value >> 2) & 1) << (7 - bit)
            value >>= 3
        colours.append([red, green, blue])
    return colours


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


class SegmentationShip:
    """Segmentation's :class:`pipeline.ship.task.ShipTask`."""

    metric = "mIoU"
    network_type = 2  # nvinfer's segmentation: it takes the argmax and attaches the class map

    def rows(self, run_dir: Path) -> list[ShipRow]:
        return scored_rows(run_dir, "miou", CARD_FIGURES)

    def model(self, run_dir: Path, rung: str) -> Path:
        from pipeline.core.manifest import Manifest

        manifest = Manifest.load(run_dir)
        stage = "export" if rung in manifest.stage("export")["outputs"] else "quantize"
        return manifest.output(stage, rung)

    def preprocess(self, run_dir: Path) -> dict[str, Any]:
        from pipeline.ship.triton import io_facts

        size = int(io_facts(self.model(run_dir, "student"))["inputs"][0]["dims"][-1])
        return {"kind": "stretch", "input_size": size, "resize": size, "channels": 3, "mean": [0.0, 0.0, 0.0],
                "std": [1.0, 1.0, 1.0], "interpolation": "bilinear", "channel_order": "rgb",
                "note": "the whole image stretched to the square (OpenCV bilinear, aspect not kept), RGB in [0, 1]: "
                        "how the data stage fed every image and mask (the mask nearest-neighbour)"}

    def labels(self, run_dir: Path) -> list[str]:
        from pipeline.core.manifest import Manifest

        return list(_json(Manifest.load(run_dir).output("data", "dataset"))["classes"])

    def postprocess(self, run_dir: Path, rung: str) -> dict[str, Any]:
        labels = self.labels(run_dir)
        return {"kind": "segmentation", "output": "logits N×classes×H×W, classes in labels.txt's order",
                "argmax": "over the class axis (1): each pixel's class, as mIoU was scored",
                "classes": labels, "palette": palette(len(labels)),
                "mask": "infer.py writes the class map at the image's own size (nearest-neighbour from the network's "
                        "square) as a PNG of class indices, and an overlay in the palette's colours"}

    def extra_files(self, run_dir: Path, rung: str, folder: Path) -> list[str]:
        return []

    def nvinfer(self, run_dir: Path, rung: str) -> dict[str, Any]:
        return {"num-detected-classes": len(self.labels(run_dir)), "segmentation-threshold": 0.0,
                "segmentation-output-order": 0}  # NCHW, as the graph writes it

    def softmax(self) -> bool:
        return True

    def power_setting(self, run_dir: Path, rung: str, device: str) -> dict[str, Any] | None:
        return None  # a segmentation run is not swept over power modes

    def per_class_drops(self, run_dir: Path, rung: str, device: str) -> list[dict[str, Any]]:
        deployed = {d["name"]: d for d in _json(run_dir / "deploy" / "results.json").get("devices", [])}
        rungs = deployed.get(device, {}).get("rungs", {})
        mine = ((rungs.get(rung) or {}).get("scores") or {}).get("per_class_iou") or {}
        teacher = ((rungs.get("teacher") or {}).get("scores") or {}).get("per_class_iou") or {}
        drops = [{"class": name, "drop_points": round(100 * (teacher[name] - value), 2)}
                 for name, value in mine.items()
                 if value is not None and teacher.get(name) is not None and teacher[name] > value]
        return sorted(drops, key=lambda d: -d["drop_points"])[:3]

    # -- the test split ------------------------------------------------------------------------------------------
    def _test(self, run_dir: Path):
        from pipeline.core.manifest import Manifest
        from pipeline.tasks.segmentation.data import load_split

        return load_split(Manifest.load(run_dir).output("data", "canvases"), "test")

    def _miou(self, run_dir: Path, predicted: np.ndarray) -> float:
        from pipeline.tasks.segmentation.metrics import score_masks

        return score_masks(self._test(run_dir).masks, predicted, self.labels(run_dir), resamples=0)["miou"]

    def nvinfer_accuracy(self, run_dir: Path, deepstream_model: Path, scaling: str) -> dict[str, Any]:
        import cv2
        import onnxruntime as ort

        test = self._test(run_dir)
        size = self.preprocess(run_dir)["input_size"]
        session = ort.InferenceSession(str(deepstream_model), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        flag = cv2.INTER_NEAREST if scaling == "nearest" else cv2.INTER_LINEAR
        predicted = np.empty(test.masks.shape, np.uint8)
        for index, image in enumerate(test.images):
            # maintain-aspect-ratio=0: the whole frame to the network's square; net-scale-factor 1/255, no offsets
            fed = cv2.resize(image, (size, size), interpolation=flag) if image.shape[:2] != (size, size) else image
            probabilities = session.run(None, {name: fed.astype(np.float32).transpose(2, 0, 1)[None] / 255.0})[0]
            # segmentation-threshold=0 over probabilities: every pixel takes its argmax
            predicted[index] = probabilities[0].argmax(0)
        return {"value": self._miou(run_dir, predicted), "images": int(len(test.images)),
                "note": f"nvinfer's feed emulated on this host: the whole image stretched to the network's size "
                        f"({scaling}), as EdgeFold fed it; nvinfer's argmax over the graph's probabilities"}

    def write_test_images(self, run_dir: Path, folder: Path) -> list[Path]:
        import cv2

        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for index, image in enumerate(self._test(run_dir).images):
            paths.append(folder / f"{index:06d}.png")
            cv2.imwrite(str(paths[-1]), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
        return paths

    def score_answers(self, run_dir: Path, answers: dict[str, Any]) -> float:
        import cv2

        masks = [cv2.imread(answers[name]["mask"], cv2.IMREAD_UNCHANGED) for name in sorted(answers)]
        missing = [name for name, mask in zip(sorted(answers), masks) if mask is None]
        if missing:
            raise ManifestError(f"infer.py's mask for {missing[0]} cannot be read ({answers[missing[0]]['mask']})",
                                fix="run infer.py again with --masks pointing at a folder that is kept")
        return self._miou(run_dir, np.stack(masks))

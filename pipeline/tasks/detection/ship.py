"""Detection's part of ``edgefold ship`` (:class:`pipeline.ship.task.ShipTask`): COCO mAP from the report's rows, the
class names, the sidecar and decoder (``detection_post.py``, numpy alone) the application decodes with.

DeepStream: ``network-type=100`` with ``output-tensor-meta=1`` — nvinfer runs the engine and attaches the raw head
tensor to each frame's metadata, and the application decodes it with the shipped decoder. A bounding-box parser
would have to be a C++ library built against the DeepStream SDK's headers for each release, and EdgeFold's heads
(anchors, box coders, centerness) would be written twice, once in C++; one decoder, the one the device measured and
scored with, is what ships.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.ship.task import ShipRow, scored_rows

CARD_FIGURES = ("latency_p99_ms", "throughput_images_per_s", "energy_mj_per_image", "power_mean_w", "peak_memory_mb")


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


class DetectionShip:
    """Detection's :class:`pipeline.ship.task.ShipTask`."""

    metric = "mAP"
    network_type = 100  # "other": nvinfer attaches the raw tensors (output-tensor-meta) and the application decodes

    def rows(self, run_dir: Path) -> list[ShipRow]:
        return scored_rows(run_dir, "map", CARD_FIGURES)

    @staticmethod
    def _output(run_dir: Path, rung: str, suffix: str = "") -> Path:
        from pipeline.core.manifest import Manifest

        manifest = Manifest.load(run_dir)
        stage = "export" if f"{rung}{suffix}" in manifest.stage("export")["outputs"] else "quantize"
        return manifest.output(stage, f"{rung}{suffix}")

    def model(self, run_dir: Path, rung: str) -> Path:
        return self._output(run_dir, rung)

    def _head(self, run_dir: Path, rung: str) -> dict[str, Any]:
        return _json(self._output(run_dir, rung, "_head"))

    def preprocess(self, run_dir: Path) -> dict[str, Any]:
        head = self._head(run_dir, "student")
        size = int(head["image_size"][0])
        if head.get("resize") == "letterbox":  # a YOLO brought as ONNX: fed as Ultralytics feeds it
            return {"kind": "letterbox_ultralytics", "input_size": size, "resize": size, "channels": 3,
                    "mean": list(head["mean"]), "std": list(head["std"]), "interpolation": "bilinear",
                    "channel_order": head.get("channel_order", "rgb"), "input_range": head.get("input_range", "0-1"),
                    "note": f"Ultralytics' LetterBox: scaled to fit, centred on grey 114: {head.get('input_note')}"}
        return {"kind": "letterbox", "input_size": size, "resize": size, "channels": 3, "mean": [0.0, 0.0, 0.0],
                "std": [1.0, 1.0, 1.0], "interpolation": "bilinear",
                "note": "scaled to fit the square (aspect kept; area when shrinking), at its top-left corner on black, "
                        f"RGB in [0, 1]: {head.get('input_note')}"}

    def labels(self, run_dir: Path) -> list[str]:
        from pipeline.core.manifest import Manifest

        return list(_json(Manifest.load(run_dir).output("data", "dataset"))["classes"])

    def postprocess(self, run_dir: Path, rung: str) -> dict[str, Any]:
        return {"kind": "detection", "decoder": "detection_post.py (decode, per-class NMS)",
                "head": self._head(run_dir, rung)}

    def extra_files(self, run_dir: Path, rung: str, folder: Path) -> list[str]:
        import device.scoring.detection_post

        shutil.copyfile(device.scoring.detection_post.__file__, folder / "detection_post.py")
        return ["detection_post.py"]

    def nvinfer(self, run_dir: Path, rung: str) -> dict[str, Any]:
        # EdgeFold's letterbox: aspect kept, the image at the top-left corner, black below and right (nvinfer pads
        # with black). A YOLO brought as ONNX was trained on Ultralytics' centred letterbox: symmetric-padding=1
        # centres it too (on black, not Ultralytics' grey 114: nvinfer has no padding value).
        return {"output-tensor-meta": 1, "maintain-aspect-ratio": 1,
                "symmetric-padding": int(self._head(run_dir, rung).get("resize") == "letterbox")}

    def softmax(self) -> bool:
        return False

    def power_setting(self, run_dir: Path, rung: str, device: str) -> dict[str, Any] | None:
        return None  # a detection run is not swept over power modes (its recipe refuses deploy.sweep)

    def per_class_drops(self, run_dir: Path, rung: str, device: str) -> list[dict[str, Any]]:
        deployed = {d["name"]: d for d in _json(run_dir / "deploy" / "results.json").get("devices", [])}
        rungs = deployed.get(device, {}).get("rungs", {})
        mine = ((rungs.get(rung) or {}).get("scores") or {}).get("per_class_ap")
        teacher = ((rungs.get("teacher") or {}).get("scores") or {}).get("per_class_ap")
        if not mine or not teacher:
            return []
        drops = [{"class": name, "drop_points": round(100 * (t - m), 2)}
                 for name, m, t in zip(self.labels(run_dir), mine, teacher) if m is not None and t is not None and t > m]
        return sorted(drops, key=lambda d: -d["drop_points"])[:3]

    # -- the test split ------------------------------------------------------------------------------------------
    def _test(self, run_dir: Path):
        from pipeline.core.manifest import Manifest
        from pipeline.tasks.detection.files import load_split

        return load_split(Manifest.load(run_dir).output("data", "canvases"), "test")

    def _map(self, run_dir: Path, detections) -> float:
        from pipeline.tasks.detection.metrics import accumulate, match, summary

        truth = self._test(run_dir).boxes
        return float(summary(accumulate(match(truth, detections, len(self.labels(run_dir)))))["map"])

    def nvinfer_accuracy(self, run_dir: Path, deepstream_model: Path, scaling: str) -> dict[str, Any]:
        import cv2
        import onnxruntime as ort

        from device.scoring.detection_post import head_spec_from_dict, postprocess
        from pipeline.tasks.detection.metrics import Boxes

        test = self._test(run_dir)
        size = self.preprocess(run_dir)["input_size"]
        from pipeline.tasks.detection.export import feed_of

        spec = head_spec_from_dict(self._head(run_dir, "student"))
        spec_feed = feed_of(self._head(run_dir, "student"))
        session = ort.InferenceSession(str(deepstream_model), providers=["CPUExecutionProvider"])
        name, found = session.get_inputs()[0].name, []
        flag = cv2.INTER_NEAREST if scaling == "nearest" else cv2.INTER_LINEAR
        centred = self.nvinfer(run_dir, "student")["symmetric-padding"] == 1
        for image in test.images:
            # maintain-aspect-ratio=1: scaled to fit with the one filter nvinfer has, on black, at the top-left corner
            # (symmetric-padding=0) or centred (1); boxes map back through the same factor and offset.
            height, width = image.shape[:2]
            factor = size / max(height, width)
            new = (max(1, int(round(width * factor))), max(1, int(round(height * factor))))
            left, top = ((size - new[0]) // 2, (size - new[1]) // 2) if centred else (0, 0)
            fitted = cv2.resize(image, new, interpolation=flag)
            fitted = np.repeat(fitted[:, :, None], 3, axis=2) if fitted.ndim == 2 else fitted
            canvas = np.zeros((size, size, 3), np.uint8)
            canvas[top:top + new[1], left:left + new[0]] = fitted
            fed = canvas.astype(np.float32).transpose(2, 0, 1)[None] / 255.0
            fed = fed[:, ::-1] if spec_feed["channel_order"] == "bgr" else fed
            fed = fed * 255.0 if spec_feed["input_range"] == "0-255" else fed
            detections = postprocess(spec, session.run(None, {name: np.ascontiguousarray(fed)})[0])[0]
            boxes = (detections["boxes"].astype(np.float64) - [left, top, left, top]) / factor
            found.append(Boxes(np.clip(boxes, 0, [width, height, width, height]), detections["labels"],
                               detections["scores"].astype(np.float64)))
        padding = "centred (symmetric-padding=1, as the YOLO was trained)" if centred else \
            "top-left (symmetric-padding=0, as EdgeFold letterboxes)"
        return {"value": self._map(run_dir, found), "images": len(test.images),
                "note": f"nvinfer's feed emulated on this host (maintain-aspect-ratio=1, {padding}, on black: scaled to "
                        f"fit with {scaling}; on the run's square canvases the feeds differ only in the filter); the "
                        "boxes decoded by the shipped detection_post.py"}

    def write_test_images(self, run_dir: Path, folder: Path) -> list[Path]:
        import cv2

        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for index, image in enumerate(self._test(run_dir).images):
            paths.append(folder / f"{index:06d}.png")
            cv2.imwrite(str(paths[-1]), image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
        return paths

    def score_answers(self, run_dir: Path, answers: dict[str, Any]) -> float:
        from pipeline.tasks.detection.metrics import Boxes

        found = [Boxes(np.asarray(answers[name]["boxes"], np.float64).reshape(-1, 4),
                       np.asarray(answers[name]["classes"], np.int64), np.asarray(answers[name]["scores"], np.float64))
                 for name in sorted(answers)]
        return self._map(run_dir, found)

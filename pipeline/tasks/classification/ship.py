"""Classification's part of ``edgefold ship`` (:class:`pipeline.ship.task.ShipTask`): top-1 from the report's rows,
the class names, top-k post-processing, ``nvinfer``'s classifier settings and the top-1 it gets under ``nvinfer``'s
stretched feed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import ManifestError
from pipeline.ship.task import ShipRow, ran_precision, report_flags
from pipeline.tasks.classification.images import data_set, recorded_splits

CARD_FIGURES = ("latency_p99_ms", "throughput_images_per_s", "energy_mj_per_image", "power_mean_w", "peak_memory_mb",
                "frame_total_ms", "frame_fps_pipelined", "sustained_ratio")


def _results(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "report" / "results.json"
    if not path.is_file():
        raise ManifestError(f"{run_dir} has no report yet: ship reads the figures the report recorded",
                            fix=f"finish the run first (make edge, or edgefold report {run_dir})")
    return json.loads(path.read_text())


def _deployed(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "deploy" / "results.json").read_text())


class ClassificationShip:
    """Classification's :class:`pipeline.ship.task.ShipTask`."""

    metric = "top-1"
    network_type = 1  # nvinfer's classifier

    def rows(self, run_dir: Path) -> list[ShipRow]:
        from pipeline.stats import binomial_interval

        deployed = {d["name"]: d for d in _deployed(run_dir).get("devices", [])}
        results = _results(run_dir)
        profiles = results.get("layer_profiles") or []
        rows = []
        for row in results["rows"]:
            on_device = row.get("device_top1") is not None
            accuracy = row.get("device_top1") if on_device else row.get("top1")
            low = high = None
            if on_device and row.get("device_images"):
                low, high = binomial_interval(int(row["device_top1_correct"]), int(row["device_images"]))
            record = deployed.get(row["device"], {}).get("rungs", {}).get(row["rung"], {})
            result = record.get("result") or {}
            built = (result.get("runtime") or {}).get("built") or {}
            figures = {key: row.get(key) for key in (*CARD_FIGURES, "latency_p50_low_ms", "latency_p50_high_ms")}
            figures["measured_batches"] = list((record.get("spec") or {}).get("batch_sizes") or [])
            rows.append(ShipRow(rung=row["rung"], device=row["device"], accuracy=accuracy,
                                accuracy_source="device" if on_device else "host", accuracy_low=low,
                                accuracy_high=high, latency_p50_ms=row.get("latency_p50_ms"),
                                batch=int(row.get("latency_batch") or 1), precision=row.get("precision") or "fp32",
                                runtime=row.get("runtime"), figures=figures,
                                engines={int(b): key for b, key in (built.get("engines") or {}).items()},
                                measured=row.get("status") == "measured", host_accuracy=row.get("top1"),
                                flags=report_flags(row), verdict=row.get("verdict") or None,
                                precision_ran=ran_precision(row, profiles)))
        return rows

    def model(self, run_dir: Path, rung: str) -> Path:
        from pipeline.core.manifest import Manifest
        from pipeline.core.rungs import RUNGS

        stage, key = RUNGS[rung].onnx
        return Manifest.load(run_dir).output(stage, key)

    def preprocess(self, run_dir: Path) -> dict[str, Any]:
        from pipeline.core.manifest import Manifest

        recorded = json.loads(Manifest.load(run_dir).output("export", "preprocess").read_text())
        return {"kind": "resize_crop", **recorded}

    def labels(self, run_dir: Path) -> list[str]:
        return list(_results(run_dir)["evaluation"]["classes"])

    def postprocess(self, run_dir: Path, rung: str) -> dict[str, Any]:
        classes = len(self.labels(run_dir))
        return {"kind": "classification", "top_k": min(5, classes), "output": "logits: one per class, in labels.txt's "
                "order; infer.py turns them into probabilities with a softmax"}

    def extra_files(self, run_dir: Path, rung: str, folder: Path) -> list[str]:
        return []

    def nvinfer(self, run_dir: Path, rung: str) -> dict[str, Any]:
        # The top class whatever its probability, as top-1 counts it (nvinfer attaches a label above this threshold).
        # output-tensor-meta: the probabilities reach deepstream/app.py too, which takes the top k from them.
        return {"classifier-threshold": 0.0, "output-tensor-meta": 1}

    def softmax(self) -> bool:
        return True

    def power_setting(self, run_dir: Path, rung: str, device: str) -> dict[str, Any] | None:
        fronts = _results(run_dir).get("power_fronts") or []
        found = next((f for f in fronts if f.get("device") == device and f.get("rung") == rung), None)
        return None if found is None else {"text": (found.get("choice") or {}).get("text"),
                                           "chosen": (found.get("choice") or {}).get("chosen")}

    def per_class_drops(self, run_dir: Path, rung: str, device: str) -> list[dict[str, Any]]:
        evaluation = _results(run_dir).get("evaluation") or {}
        per_class = evaluation.get("per_class_device") or {}
        mine, teacher = per_class.get(f"{rung}@{device}"), per_class.get(f"teacher@{device}")
        if not mine or not teacher:
            return []
        drops = [{"class": name, "drop_points": round(100 * (t - m), 2)}
                 for name, m, t in zip(evaluation["classes"], mine, teacher) if t - m > 0]
        return sorted(drops, key=lambda d: -d["drop_points"])[:3]

    # -- the test split, as images ------------------------------------------------------------------------------------
    def _test(self, run_dir: Path) -> tuple[list[np.ndarray], np.ndarray]:
        from pipeline.core.context import RunContext
        from pipeline.core.manifest import Manifest

        ctx = RunContext.of_run(Manifest.load(run_dir))
        test, indices = data_set(ctx).test, recorded_splits(ctx)["test"]
        return [test.image(int(i)) for i in indices], np.asarray(test.labels)[indices]

    def nvinfer_accuracy(self, run_dir: Path, deepstream_model: Path, scaling: str) -> dict[str, Any]:
        import cv2
        import onnxruntime as ort

        from pipeline.ship.deepstream import normalization

        pre = self.preprocess(run_dir)
        scale, offsets, _ = normalization(pre)  # the graph applies the per-channel part itself
        size, channels = pre["input_size"], pre["channels"]
        flag = cv2.INTER_NEAREST if scaling == "nearest" else cv2.INTER_LINEAR
        images, labels = self._test(run_dir)
        session = ort.InferenceSession(str(deepstream_model), providers=["CPUExecutionProvider"])
        name, correct = session.get_inputs()[0].name, 0
        offset = np.asarray(offsets, np.float32).reshape(1, -1, 1, 1)
        for start in range(0, len(images), 256):
            batch = []
            for image in images[start:start + 256]:
                stretched = cv2.resize(image, (size, size), interpolation=flag)  # the whole frame, aspect not kept
                stretched = stretched[:, :, None] if stretched.ndim == 2 else stretched
                if channels == 3 and stretched.shape[2] == 1:
                    stretched = np.repeat(stretched, 3, axis=2)
                elif channels == 1 and stretched.shape[2] == 3:
                    stretched = cv2.cvtColor(stretched, cv2.COLOR_RGB2GRAY)[:, :, None]
                batch.append(stretched[:, :, ::-1] if pre.get("channel_order") == "bgr" else stretched)
            fed = scale * (np.stack(batch).astype(np.float32).transpose(0, 3, 1, 2) - offset)
            probabilities = session.run(None, {name: np.ascontiguousarray(fed, np.float32)})[0]
            correct += int((probabilities.argmax(1) == labels[start:start + 256]).sum())
        return {"value": correct / len(labels), "images": int(len(labels)),
                "note": "nvinfer's feed emulated on this host: the whole image stretched to the network's size "
                        f"({scaling}), scaled by net-scale-factor after offsets"}

    def write_test_images(self, run_dir: Path, folder: Path) -> list[Path]:
        import cv2

        images, _ = self._test(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for index, image in enumerate(images):
            path = folder / f"{index:06d}.png"
            cv2.imwrite(str(path), image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
            paths.append(path)
        return paths

    def score_answers(self, run_dir: Path, answers: dict[str, Any]) -> float:
        _, labels = self._test(run_dir)
        predicted = [answers[name]["top"][0][0] for name in sorted(answers)]
        return float((np.asarray(predicted) == labels).mean())

"""Accuracy as the device ran it: the evaluation set's predictions by the engine that was timed, scored
against the labels the build host keeps, and compared with the host's ONNX Runtime predictions on the
same images (share of identical top-1, McNemar's exact test on the pair)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.perclass import mcnemar_exact, per_class

# Below this McNemar p-value the device's top-1 differs from the host's by more than noise.
DEVIATION_P = 0.05
CAUSES = ("likely causes: FP16 overflow in a float island, a fused INT8 layer (residual add, Q/DQ "
          "placement), or a different calibration; look at the per-layer profile (\"Where the time goes\") for "
          "the layers left in float and their precision on the device")


def device_scores(record: dict[str, Any], rung: str, predictions: list[list[int]]) -> dict[str, Any]:
    """The device's top-1/top-5 on the evaluation set, and how it agrees with the host's predictions.

    Args:
        record: The deploy stage's ``evaluation`` (labels, each rung's host top-1 on the same images).
        rung: The rung whose device predictions these are.
        predictions: The device's top-k classes per image (``EvaluationResult.predictions``).
    """
    labels = np.asarray(record["labels"])
    ranked = np.asarray(predictions)
    top1 = ranked[:, 0]
    device_correct = top1 == labels
    out: dict[str, Any] = {"device_images": int(len(labels)), "device_top1_correct": int(device_correct.sum()),
                           "device_top1": float(device_correct.mean()),
                           "device_top5": float((ranked == labels[:, None]).any(axis=1).mean())}
    host = record.get("host_top1", {}).get(rung)
    if host is not None:
        host = np.asarray(host)
        host_correct = host == labels
        only_host, only_device = int((host_correct & ~device_correct).sum()), int((~host_correct & device_correct).sum())
        p_value = mcnemar_exact(only_host, only_device)
        out.update(host_top1_same_images=float(host_correct.mean()), host_top1_correct_same_images=int(host_correct.sum()),
                   agreement=float((top1 == host).mean()), only_host_correct=only_host,
                   only_device_correct=only_device, mcnemar_p=p_value,
                   device_deviates=bool(p_value < DEVIATION_P and only_host != only_device))
    return out


def per_class_device(record: dict[str, Any], predictions: list[list[int]]) -> list[float | None]:
    """Per-class accuracy of the device's top-1 on the evaluation set."""
    labels = np.asarray(record["labels"])
    return per_class(labels, np.asarray(predictions)[:, 0], len(record["classes"]))["accuracy"]


def paired_top1_change(record: dict[str, Any], before: list[list[int]], after: list[list[int]]) -> dict[str, Any]:
    """The top-1 change from one rung to another on the same device and images (``after`` − ``before``),
    in points, with McNemar's exact p on the discordant images."""
    labels = np.asarray(record["labels"])
    a, b = np.asarray(before)[:, 0] == labels, np.asarray(after)[:, 0] == labels
    only_before, only_after = int((a & ~b).sum()), int((~a & b).sum())
    return {"delta_points": 100 * (int(b.sum()) - int(a.sum())) / len(labels),
            "mcnemar_p": mcnemar_exact(only_before, only_after), "images": int(len(labels))}


def whole_path_scores(evaluation: dict[str, Any] | None, rung: str | None):
    """The frame report's scoring of ``source: images`` (:func:`pipeline.deploy.frame_report.frame_fields`), or None
    without the deploy stage's ``evaluation`` record (it holds the labels)."""
    if not evaluation:
        return None
    return lambda scores, tensor: _deployed_path_scores(scores, tensor, evaluation, rung)


def _deployed_path_scores(scores, tensor, evaluation: dict[str, Any], rung: str | None) -> dict[str, Any]:
    """The deployed path's top-1 on the evaluation images, and its change from the tensor path's on the same
    engine and images with McNemar's exact p (:func:`paired_top1_change`)."""
    labels = evaluation["labels"]
    if scores.images != len(labels):
        return {"frame_scores_error": f"the whole path scored {scores.images} images, the evaluation set has "
                                      f"{len(labels)}: not compared"}
    out = {"frame_images": scores.images, "frame_top1": device_scores(evaluation, rung, scores.predictions)
           ["device_top1"]}
    if scores.in_graph_predictions is not None:
        out["frame_in_graph_top1"] = device_scores(evaluation, rung, scores.in_graph_predictions)["device_top1"]
    if tensor is not None and len(tensor.predictions) == len(labels):
        change = paired_top1_change(evaluation, tensor.predictions, scores.predictions)
        out.update(frame_top1_tensor=device_scores(evaluation, rung, tensor.predictions)["device_top1"],
                   frame_top1_delta_points=change["delta_points"], frame_top1_p=change["mcnemar_p"])
    return out

"""mIoU with a bootstrap interval over images, per-class IoU, and the per-class test of one model against another.

IoU of a class is TP / (TP + FP + FN) over every pixel of the split (the confusion matrix summed over images, as
torchvision's reference scripts and the Cityscapes benchmark do); mIoU is its mean over the classes that occur in the
truth or the prediction. The interval resamples whole images (pixels of one image are not independent).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from device.errors import StageError


def confusions(truth: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """Per-image confusion matrices (N×classes×classes, rows the truth), from N×H×W masks; a truth pixel of no class
    (:data:`~pipeline.tasks.segmentation.data.IGNORE`) counts nowhere."""
    from pipeline.tasks.segmentation.data import IGNORE

    if truth.shape != predicted.shape:
        raise ValueError(f"masks of shape {truth.shape} and {predicted.shape} cannot be compared")
    flat = truth.reshape(len(truth), -1).astype(np.int64) * classes + predicted.reshape(len(truth), -1)
    kept = truth.reshape(len(truth), -1) != IGNORE
    return np.stack([np.bincount(row[keep], minlength=classes * classes)
                     for row, keep in zip(flat, kept)]).reshape(-1, classes, classes)


def class_iou(confusion: np.ndarray) -> np.ndarray:
    """Each class's IoU from a summed confusion matrix (NaN where the class is in neither truth nor prediction)."""
    hit = np.diag(confusion).astype(np.float64)
    union = confusion.sum(0) + confusion.sum(1) - hit
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, hit / np.maximum(union, 1), np.nan)


def _miou(confusion: np.ndarray) -> float:
    return float(np.nanmean(class_iou(confusion)))


def _resampled(count: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, count, size=(resamples, count))


def score_masks(truth: np.ndarray, predicted: np.ndarray, classes: Sequence[str], resamples: int = 200,
                seed: int = 0) -> dict[str, Any]:
    """mIoU with its 95% percentile bootstrap interval over images (none when ``resamples`` is 0), pixel accuracy
    and each class's IoU."""
    per_image = confusions(truth, predicted, len(classes))
    total = per_image.sum(0)
    ious = class_iou(total)
    scores = {"miou": _miou(total), "miou_low": None, "miou_high": None,
              "pixel_accuracy": float(np.trace(total) / max(1, total.sum())), "images": int(len(truth)),
              "per_class_iou": {name: (None if np.isnan(v) else float(v)) for name, v in zip(classes, ious)}}
    if resamples:
        draws = [_miou(per_image[index].sum(0)) for index in _resampled(len(truth), resamples, seed)]
        scores["miou_low"], scores["miou_high"] = (float(v) for v in np.percentile(draws, [2.5, 97.5]))
    return scores


def class_changes(truth: np.ndarray, before: np.ndarray, after: np.ndarray, classes: Sequence[str],
                  resamples: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """Each class's IoU after against before on the same images, in points, with a paired bootstrap interval over
    images; ``significant`` where the interval excludes 0. Sorted worst first."""
    a = confusions(truth, before, len(classes))
    b = confusions(truth, after, len(classes))
    change = 100 * (class_iou(b.sum(0)) - class_iou(a.sum(0)))
    draws = np.array([100 * (class_iou(b[i].sum(0)) - class_iou(a[i].sum(0)))
                      for i in _resampled(len(truth), resamples, seed)])
    rows = []
    for k, name in enumerate(classes):
        if np.isnan(change[k]):
            continue
        low, high = (float(v) for v in np.nanpercentile(draws[:, k], [2.5, 97.5]))
        rows.append({"class": name, "iou_before": float(class_iou(a.sum(0))[k]),
                     "iou_after": float(class_iou(b.sum(0))[k]), "change_points": float(change[k]) + 0.0,
                     "change_low": low, "change_high": high, "significant": bool(low > 0 or high < 0)})
    return sorted(rows, key=lambda r: (r["change_points"], r["class"]))


def require_sane(scores: dict[str, Any], what: str) -> None:
    """Refuses a model that finds no object class at all: every later comparison with it would be empty.

    Raises:
        StageError: Every class but the background scores IoU 0.
    """
    objects = [v for name, v in list(scores["per_class_iou"].items())[1:] if v is not None]
    if not objects or max(objects) == 0:
        raise StageError(f"{what} predicts no object pixel correctly (mIoU {100 * scores['miou']:.1f}, every object "
                         "class at IoU 0)", fix="train longer (train.epochs) or with a higher learning rate")

"""Scores on integer counts and the model sanity gates on them.

A model at chance, or one that predicts a single class, fails its stage.

Every rung's accuracy is compared against another rung's, so a teacher that learned nothing makes
every later gate pass ("0.00 points lost") and every headline a win. The gates run after the
teacher, after distillation and on the INT8 model, on the counts of :func:`accuracy`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from device.errors import StageError

# A one-sided binomial bound: a constant guesser stays below p0·n + 3σ in 99.87% of test sets.
CHANCE_SIGMAS = 3.0
# One class taking this share of all predictions, while it is a much smaller share of the labels.
COLLAPSE_SHARE = 0.9
COLLAPSE_EXCESS = 0.25


def recorded_scores(metrics: dict) -> dict:
    """What a stage records of its model's test scores: the fractions and the counts behind them."""
    keys = ("top1", "top5", "top1_correct", "top5_correct", "images", "predicted_counts", "label_counts",
            "top1_before_bn_recalibration")
    return {key: metrics[key] for key in keys if key in metrics}


def assess(scores: dict[str, Any], classes: Sequence[str] | None = None) -> dict[str, Any]:
    """Judges one model's test-split scores (the output of :func:`pipeline.tasks.classification.scores.accuracy`).

    Chance is what the best constant guess scores: the largest class's share of the test labels
    (1/classes when balanced). A top-1 count within ``CHANCE_SIGMAS`` binomial standard deviations
    above it is "at chance". A model is "collapsed" when one class takes ``COLLAPSE_SHARE`` of its
    predictions although that class is far rarer among the labels.

    Returns:
        ``at_chance``, ``collapsed`` (bools), ``chance_top1``, ``noise_top1`` (fractions), and for a
        collapse the class and its share of predictions and of labels.
    """
    n = scores["images"]
    labels = scores["label_counts"]
    predicted = scores["predicted_counts"]
    p0 = max(labels) / n if n else 0.0
    noise = CHANCE_SIGMAS * math.sqrt(n * p0 * (1 - p0))
    at_chance = n > 0 and scores["top1_correct"] <= n * p0 + noise
    top_class = max(range(len(predicted)), key=predicted.__getitem__) if predicted else 0
    predicted_share = predicted[top_class] / n if n else 0.0
    label_share = labels[top_class] / n if n else 0.0
    collapsed = n > 0 and predicted_share >= COLLAPSE_SHARE and predicted_share - label_share >= COLLAPSE_EXCESS
    name = classes[top_class] if classes and top_class < len(classes) else str(top_class)
    return {"at_chance": bool(at_chance), "collapsed": bool(collapsed), "chance_top1": p0,
            "noise_top1": (n * p0 + noise) / n if n else 0.0, "predicted_classes": sum(1 for c in predicted if c),
            "top_predicted_class": name, "top_predicted_share": predicted_share, "top_predicted_label_share": label_share}


def describe(verdict: dict[str, Any], scores: dict[str, Any]) -> str:
    """One line: what is wrong with the model, in numbers."""
    parts = []
    if verdict["collapsed"]:
        parts.append(f"predicts class {verdict['top_predicted_class']!r} for {100 * verdict['top_predicted_share']:.1f}% "
                     f"of the test images ({100 * verdict['top_predicted_label_share']:.1f}% of the labels)")
    if verdict["at_chance"]:
        parts.append(f"top-1 {scores['top1_correct']}/{scores['images']} = {100 * scores['top1']:.2f}% is within "
                     f"noise of chance ({100 * verdict['chance_top1']:.2f}%, noise bound {100 * verdict['noise_top1']:.2f}%)")
    return "; ".join(parts)


def require_sane(what: str, scores: dict[str, Any], classes: Sequence[str] | None, causes: str, fix: str) -> dict:
    """Fails the stage when the model is at chance or collapsed; returns the verdict otherwise.

    Raises:
        StageError: Naming the numbers, the likely causes and the fix.
    """
    verdict = assess(scores, classes)
    if verdict["at_chance"] or verdict["collapsed"]:
        raise StageError(f"{what} learned nothing usable: {describe(verdict, scores)}. Likely causes: {causes}",
                         fix=fix)
    return verdict


def verdict(rung: str, facts: dict) -> str:
    """What the score means when it is no score: "collapsed" (one class for every image) is not "chance".

    A pruned rung before distillation is expected to be bad, and is said to be.
    """
    sanity = facts.get("sanity") or {}
    expected = " (expected before distillation)" if rung == "pruned" else ""
    if sanity.get("collapsed"):
        return (f"collapsed: predicts {sanity['top_predicted_class']!r} for "
                f"{100 * sanity['top_predicted_share']:.0f}% of images{expected}")
    if sanity.get("at_chance"):
        return f"at chance{expected}"
    never = facts.get("never_predicted") or []
    if never:
        return f"never predicts {', '.join(map(repr, never[:3]))}{' …' if len(never) > 3 else ''}"
    return ""


def accuracy(logits, labels, topk: tuple[int, ...] = (1, 5)) -> dict:
    """Top-k accuracies from integer counts; k is capped at the class count.

    Every comparison (gates, deltas) is made on the counts (``top1_correct`` of ``images``): in
    floating point one image of 100 is ``1.0000000000000009`` points, which fails a 1.0 budget.
    The fractions are computed once from the counts, for display. Takes torch tensors or arrays.

    Returns:
        ``top1``/``top5`` (fractions), ``top1_correct``/``top5_correct`` and ``images`` (ints),
        and ``predicted_counts``: how often each class was predicted (collapse checks).
    """
    import numpy as np

    logits = np.asarray(logits.detach().cpu() if hasattr(logits, "detach") else logits)
    labels = np.asarray(labels.detach().cpu() if hasattr(labels, "detach") else labels)
    result: dict = {"images": int(len(labels))}
    order = np.argsort(-logits, axis=1, kind="stable") if len(labels) else np.zeros((0, 1), dtype=np.int64)
    for k in topk:
        kk = min(k, logits.shape[1])
        correct = int((order[:, :kk] == labels[:, None]).any(axis=1).sum())
        result[f"top{k}_correct"] = correct
        result[f"top{k}"] = correct / len(labels) if len(labels) else 0.0
    predicted = order[:, 0] if len(labels) else np.zeros(0, dtype=np.int64)
    result["predicted_counts"] = np.bincount(predicted, minlength=logits.shape[1]).astype(int).tolist()
    result["label_counts"] = np.bincount(labels, minlength=logits.shape[1]).astype(int).tolist()
    return result


def save_top1(path: Path, logits) -> Path:
    """Saves each image's top-1 class as an int32 ``.npy`` (ties to the lower class, as ``accuracy``)."""
    import numpy as np

    logits = np.asarray(logits.detach().cpu() if hasattr(logits, "detach") else logits)
    np.save(path, np.argsort(-logits, axis=1, kind="stable")[:, 0].astype(np.int32), allow_pickle=False)
    return Path(path)

"""What the fold cost, per class: per-class scores of every rung and paired tests between rungs.

Compression concentrates its damage on a few classes and on under-represented examples (Hooker et
al., "What Do Compressed Deep Neural Networks Forget?", 2019), which an average hides. Every rung is
scored on the same test images, so two rungs are compared image by image with McNemar's exact test
on the images where they disagree: it uses the pairing (a bootstrap of the two accuracies as if
independent would need far more images to see the same drop), and it is exact for the small counts
a single class has. Holm's step-down correction over the classes keeps the chance of flagging any
class by luck at 5%, so a drop within noise is not flagged.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from pipeline.stats import mcnemar_exact  # noqa: F401 (this module's callers import it from here too)

ALPHA = 0.05


def per_class(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> dict[str, Any]:
    """Per-class accuracy (recall), precision and support, and the confusion matrix (rows: true class).

    A class with no test images has accuracy None; one never predicted has precision None.
    """
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    support = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    diagonal = np.diag(confusion)
    return {
        "accuracy": [int(d) / int(s) if s else None for d, s in zip(diagonal, support)],
        "precision": [int(d) / int(p) if p else None for d, p in zip(diagonal, predicted)],
        "support": support.astype(int).tolist(),
        "predicted": predicted.astype(int).tolist(),
        "correct": diagonal.astype(int).tolist(),
        "confusion": confusion.astype(int).tolist(),
    }


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (same order as given)."""
    order = sorted(range(len(pvalues)), key=pvalues.__getitem__)
    adjusted = [1.0] * len(pvalues)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


def class_changes(labels: np.ndarray, before: np.ndarray, after: np.ndarray, classes: Sequence[str],
                  alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Per class: accuracy before and after, the change in points, and whether it is significant.

    Returns:
        One row per class with test images, sorted by the change (largest drop first).
    """
    rows = []
    for index, name in enumerate(classes):
        mask = labels == index
        n = int(mask.sum())
        if not n:
            continue
        right_before, right_after = before[mask] == index, after[mask] == index
        lost, gained = int((right_before & ~right_after).sum()), int((~right_before & right_after).sum())
        rows.append({"class": name, "images": n, "accuracy_before": int(right_before.sum()) / n,
                     "accuracy_after": int(right_after.sum()) / n,
                     "change_points": round(100 * (int(right_after.sum()) - int(right_before.sum())) / n, 10) + 0.0,
                     "lost": lost, "gained": gained, "p_value": mcnemar_exact(lost, gained)})
    for row, adjusted in zip(rows, holm([r["p_value"] for r in rows])):
        row["p_holm"] = adjusted
        row["significant"] = adjusted < alpha
    return sorted(rows, key=lambda r: (r["change_points"], r["class"]))


# The comparisons the report shows: what distillation cost, what INT8 cost on top, and the whole fold
# (the headline's accuracy change and the classes it names).
COMPARISONS = (("teacher", "student"), ("student", "student_int8"), ("teacher", "student_int8"))


def summarize(labels: np.ndarray, predictions: dict[str, np.ndarray], classes: Sequence[str]) -> dict[str, Any]:
    """Per-class results of every rung and the comparisons between rungs (for the manifest and report)."""
    rungs = {}
    for rung, predicted in predictions.items():
        scores = per_class(labels, predicted, len(classes))
        never = [classes[i] for i, count in enumerate(scores["predicted"]) if count == 0 and scores["support"][i]]
        rungs[rung] = {**scores, "never_predicted": never}
    comparisons = []
    for before, after in COMPARISONS:
        if before in predictions and after in predictions:
            rows = class_changes(labels, predictions[before], predictions[after], classes)
            right_before, right_after = predictions[before] == labels, predictions[after] == labels
            lost, gained = int((right_before & ~right_after).sum()), int((~right_before & right_after).sum())
            overall = {"images": int(len(labels)), "lost": lost, "gained": gained,
                       "change_points": round(100 * (gained - lost) / max(1, len(labels)), 10) + 0.0,
                       "p_value": mcnemar_exact(lost, gained)}
            comparisons.append({"before": before, "after": after, "test": "McNemar exact, Holm-corrected",
                                "alpha": ALPHA, "overall": overall, "classes": rows,
                                "significant_drops": [r["class"] for r in rows
                                                      if r["significant"] and r["change_points"] < 0]})
    return {"classes": list(classes), "rungs": rungs, "comparisons": comparisons}


# ----------------------------------------------------------------- the report's section
def section(summary: dict[str, Any], top: int = 5):
    """The report's "What the fold cost, per class" section (:class:`pipeline.report.sections.Section`).

    Args:
        summary: What the evaluate stage records: ``classes``, ``accuracy`` and ``never_predicted``
            per rung, and ``comparisons`` (see :func:`summarize`).
    """
    from pipeline.report.sections import Bullets, Section, Table, Text

    blocks: list = []
    never = [(rung, classes) for rung, classes in summary["never_predicted"].items() if classes]
    if never:
        blocks.append(Bullets([(rung, " never predicts " + ", ".join(map(repr, classes))
                                + (" (a pruned model before distillation is expected to be bad)" if rung == "pruned"
                                   else "")) for rung, classes in never]))
    for comparison in summary["comparisons"]:
        drops = comparison["significant_drops"]
        overall = comparison.get("overall")
        whole = (f" Over all {overall['images']} images: {overall['change_points']:+.2f} points, McNemar p = "
                 f"{overall['p_value']:.2g}." if overall else "")
        blocks.append(Text(f"{comparison['before']} → {comparison['after']} ({comparison['test']}, "
                           f"α = {comparison['alpha']}): " + (f"significant drops in {', '.join(map(repr, drops))}."
                                                              if drops else "no class dropped by more than noise.")
                           + whole))
        rows = [["class", "images", comparison["before"], comparison["after"], "Δ points", "lost / gained",
                 "p (Holm)", "significant"]]
        for row in comparison["classes"][:top]:
            rows.append([row["class"], str(row["images"]), f"{100 * row['accuracy_before']:.1f}%",
                         f"{100 * row['accuracy_after']:.1f}%", f"{row['change_points']:+.1f}",
                         f"{row['lost']} / {row['gained']}", f"{row['p_holm']:.3g}",
                         "yes" if row["significant"] else "no"])
        blocks.append(Table(rows))
    return Section("What the fold cost, per class", blocks)


def plot(summary: dict[str, Any]):
    """Per-class accuracy per rung (a matplotlib figure), classes sorted by the student's drop."""
    import matplotlib.pyplot as plt

    classes = summary["classes"]
    rungs = list(summary["accuracy"])
    width = 0.8 / max(len(rungs), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(classes) + 2), 4.0))
    positions = np.arange(len(classes))
    for index, rung in enumerate(rungs):
        values = [100 * v if v is not None else 0.0 for v in summary["accuracy"][rung]]
        ax.bar(positions + (index - (len(rungs) - 1) / 2) * width, values, width, label=rung)
    ax.set_xticks(positions, [c if len(c) <= 12 else c[:11] + "…" for c in classes], rotation=45, ha="right",
                  fontsize=8)
    ax.set_ylabel("accuracy on the class's test images, %")
    ax.set_ylim(0, 105)
    ax.set_title("Per-class accuracy per rung")
    # Below the axes: inside, the legend covered the bars of the first classes.
    ax.legend(fontsize=8, ncol=min(len(rungs), 5), loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    return fig

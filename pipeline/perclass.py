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

from math import comb
from typing import Any, Sequence

import numpy as np

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


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: ``only_a`` images right under A alone, ``only_b`` under B alone.

    Under "no difference" each disagreement is a fair coin: p = 2·P(X ≤ min) for X ~ Bin(n, ½), capped at 1.
    """
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


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


# The comparisons the report shows: what distillation cost, and what INT8 cost on top.
COMPARISONS = (("teacher", "student"), ("student", "student_int8"))


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
            comparisons.append({"before": before, "after": after, "test": "McNemar exact, Holm-corrected",
                                "alpha": ALPHA, "classes": rows,
                                "significant_drops": [r["class"] for r in rows
                                                      if r["significant"] and r["change_points"] < 0]})
    return {"classes": list(classes), "rungs": rungs, "comparisons": comparisons}


# ----------------------------------------------------------------- rendering (report)
def markdown_section(summary: dict[str, Any], top: int = 5) -> list[str]:
    """The report's "what the fold cost, per class" section as Markdown lines.

    Args:
        summary: What the evaluate stage records: ``classes``, ``accuracy`` and ``never_predicted``
            per rung, and ``comparisons`` (see :func:`summarize`).
    """
    lines = ["## What the fold cost, per class", ""]
    for rung, never in summary["never_predicted"].items():
        if never:
            lines.append(f"- **{rung}** never predicts {', '.join(repr(c) for c in never)}"
                         + (" (a pruned model before distillation is expected to be bad)" if rung == "pruned" else ""))
    if any(summary["never_predicted"].values()):
        lines.append("")
    for comparison in summary["comparisons"]:
        drops = comparison["significant_drops"]
        lines += [f"**{comparison['before']} → {comparison['after']}** ({comparison['test']}, α = {comparison['alpha']}): "
                  + (f"significant drops in {', '.join(repr(c) for c in drops)}." if drops
                     else "no class dropped by more than noise."), ""]
        rows = [["class", "images", comparison["before"], comparison["after"], "Δ points", "lost / gained",
                 "p (Holm)", "significant"]]
        for row in comparison["classes"][:top]:
            rows.append([row["class"], str(row["images"]), f"{100 * row['accuracy_before']:.1f}%",
                         f"{100 * row['accuracy_after']:.1f}%", f"{row['change_points']:+.1f}",
                         f"{row['lost']} / {row['gained']}", f"{row['p_holm']:.3g}",
                         "yes" if row["significant"] else "no"])
        lines += [_table(rows), ""]
    return lines


def html_section(summary: dict[str, Any], top: int = 5) -> str:
    """The same section as HTML (tables as tables, not scraped from the Markdown)."""
    from html import escape

    parts = ["<h2>What the fold cost, per class</h2>"]
    never = [(rung, classes) for rung, classes in summary["never_predicted"].items() if classes]
    if never:
        parts.append("<ul>" + "".join(
            f"<li><b>{escape(rung)}</b> never predicts {escape(', '.join(map(repr, classes)))}"
            + (" (a pruned model before distillation is expected to be bad)" if rung == "pruned" else "") + "</li>"
            for rung, classes in never) + "</ul>")
    for comparison in summary["comparisons"]:
        drops = comparison["significant_drops"]
        parts.append(f"<p><b>{escape(comparison['before'])} → {escape(comparison['after'])}</b> "
                     f"({escape(comparison['test'])}, α = {comparison['alpha']}): "
                     + (f"significant drops in {escape(', '.join(map(repr, drops)))}." if drops
                        else "no class dropped by more than noise.") + "</p>")
        head = ["class", "images", comparison["before"], comparison["after"], "Δ points", "lost / gained", "p (Holm)",
                "significant"]
        body = "".join(
            "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in (
                row["class"], str(row["images"]), f"{100 * row['accuracy_before']:.1f}%",
                f"{100 * row['accuracy_after']:.1f}%", f"{row['change_points']:+.1f}",
                f"{row['lost']} / {row['gained']}", f"{row['p_holm']:.3g}", "yes" if row["significant"] else "no"))
            + "</tr>" for row in comparison["classes"][:top])
        parts.append('<div class="scroll"><table><tr>' + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
                     + body + "</table></div>")
    return "\n".join(parts)


def _table(rows: list[list[str]]) -> str:
    head, *body = rows
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in body])


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
    ax.legend(fontsize=8, ncol=len(rungs))
    ax.grid(True, axis="y", alpha=0.3)
    return fig

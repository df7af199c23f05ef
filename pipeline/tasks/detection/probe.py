"""How a detector brought as ONNX is fed, found rather than guessed: RGB or BGR, pixels in 0–1 or 0–255, and (a COCO
set) Ultralytics' centred letterbox or EdgeFold's top-left one. A library: the detection export stage runs it on a
started graph before the ladder enters.

The graph is scored (mAP through the device's decode) on a seeded slice of the *training* images, as declared and
with one factor changed at a time. When one scores higher than the declared beyond noise (a paired bootstrap over
the slice's images of the difference in mAP, Bonferroni over the alternatives, p < :data:`ALPHA`), the stage stops
with both scores and the recipe keys that select it, or goes on with a warning where the recipe says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

ALPHA = 0.05
SLICE_IMAGES = 128
RESAMPLES = 400


@dataclass(frozen=True)
class Feed:
    """One way of feeding the graph: the recipe keys that select it."""

    channel_order: str = "rgb"
    input_range: str = "0-1"
    letterbox: str | None = None  # a COCO set's; None for composited canvases (square: every letterbox is one)

    def keys(self) -> dict[str, str]:
        keys = {"start.channel_order": self.channel_order, "start.input_range": self.input_range}
        return keys if self.letterbox is None else {**keys, "data.letterbox": self.letterbox}


def alternatives(declared: Feed) -> list[tuple[str, Feed]]:
    """The declared feed with one factor changed at a time."""
    other = {"rgb": "bgr", "bgr": "rgb", "0-1": "0-255", "0-255": "0-1", "top_left": "ultralytics",
             "ultralytics": "top_left"}
    found = [(f"{other[declared.channel_order].upper()} channel order",
              replace(declared, channel_order=other[declared.channel_order])),
             (f"pixels in {other[declared.input_range]}", replace(declared, input_range=other[declared.input_range]))]
    if declared.letterbox is not None:
        found.append((f"{other[declared.letterbox]} letterbox", replace(declared, letterbox=other[declared.letterbox])))
    return found


def probe_detector(score: Callable[[Feed], Any], declared: Feed, images: int, seed: int = 0) -> dict[str, Any]:
    """Scores every feed and tests the best against the declared one.

    Args:
        score: ``score(feed)`` → that feed's :class:`pipeline.tasks.detection.metrics.Matches` on the slice (the same
            images in the same order for every feed).
        images: The slice's size.

    Returns:
        ``declared`` and ``best`` (``label``, ``map``, the keys), ``p_value``, ``better``, ``tried``, ``images``.
    """
    from pipeline.tasks.detection.metrics import accumulate, bootstrap_draws, resampled_summary, summary

    tried = [("declared", declared, score(declared))] + [(label, feed, score(feed)) for label, feed in
                                                         alternatives(declared)]
    points = [summary(accumulate(matches))["map"] for _, _, matches in tried]
    points = [0.0 if value != value else float(value) for value in points]  # NaN: no box of any class scored
    best = int(np.argmax(points))
    p_value = 1.0
    if best and points[best] > points[0]:
        base, other = tried[0][2], tried[best][2]
        full_base, full_other = accumulate(base), accumulate(other)

        def difference(picked: np.ndarray) -> float:
            return resampled_summary(other, picked, full_other)["map"] - resampled_summary(base, picked, full_base)["map"]

        draws = bootstrap_draws(images, difference, RESAMPLES, seed)[:, 0]
        draws = draws[~np.isnan(draws)]
        one_sided = (np.sum(draws <= 0) + 1) / (len(draws) + 1)
        p_value = float(min(1.0, one_sided * (len(tried) - 1)))
    return {"images": images, "declared": {"map": points[0], **declared.keys()},
            "best": {"label": tried[best][0], "map": points[best], **tried[best][1].keys()},
            "p_value": p_value, "better": bool(best != 0 and points[best] > points[0] and p_value < ALPHA),
            "tried": [{"label": label, "map": value} for (label, _, _), value in zip(tried, points)]}


def check_started_detector(ctx, path: Path, classes: list[str], size: int) -> dict[str, Any] | None:
    """Probes a started detector (``path``, its sidecar beside it) on a seeded slice of the run's training images;
    stops with :class:`device.errors.StageError` or warns (``start.preprocess_check``) when another feed beats the
    declared one. Returns the probe's record, None when the check is off."""
    from device.scoring.detection_post import load_head_spec
    from device.errors import StageError
    from pipeline.tasks.detection.data import coco_set
    from pipeline.tasks.detection.export import network_inputs, sidecar_path
    from pipeline.tasks.detection.files import load_split
    from pipeline.tasks.detection.metrics import match
    from pipeline.tasks.detection.onnx import onnx_detections

    start, data = ctx.recipe.start, ctx.recipe.data
    if start.preprocess_check == "off":
        return None
    coco = data.source.startswith("coco:")
    train = load_split(ctx.manifest.output("data", "canvases"), "train")
    count = min(SLICE_IMAGES, len(train))
    chosen = np.sort(np.random.default_rng(data.seed).permutation(len(train))[:count])
    spec = load_head_spec(sidecar_path(path))
    sets = {data.letterbox if coco else None: ([train.images[i] for i in chosen], [train.boxes[i] for i in chosen])}

    def score(feed: Feed):
        if feed.letterbox not in sets:  # the same training images, letterboxed the other way
            other = coco_set(data.source.partition(":")[2], data.train_images, data.test_images, data.canvas.size,
                             data.seed, style=feed.letterbox, train_only=int(chosen[-1]) + 1).train
            sets[feed.letterbox] = ([other.images[i] for i in chosen], [other.boxes[i] for i in chosen])
        images, truth = sets[feed.letterbox]
        inputs = network_inputs(np.stack(images), size, feed.channel_order, feed.input_range)
        found, _ = onnx_detections(path, inputs, [tuple(image.shape[:2]) for image in images], spec)
        return match(truth, found, len(classes))

    declared = Feed(start.channel_order, start.input_range, data.letterbox if coco else None)
    result = probe_detector(score, declared, count, seed=data.seed)
    ctx.log(f"export: feed probe on {count} training images: declared mAP {100 * result['declared']['map']:.1f}, "
            f"best {result['best']['label']} {100 * result['best']['map']:.1f} (p = {result['p_value']:.2g})")
    if result["better"]:
        changed = {key: value for key, value in result["best"].items()
                   if "." in key and result["declared"].get(key) != value}
        problem = (f"the detector scores mAP {100 * result['declared']['map']:.1f} as declared and "
                   f"{100 * result['best']['map']:.1f} with {result['best']['label']} on {count} training images "
                   f"(paired bootstrap p = {result['p_value']:.2g}, adjusted): it was probably trained on images fed "
                   "otherwise")
        fix = (f"set SET='{' '.join(f'{k}={v}' for k, v in changed.items())}' (or those keys in the recipe); or "
               "start.preprocess_check: warn to go on as declared")
        if start.preprocess_check == "stop":
            raise StageError(problem, fix=fix)
        ctx.log(f"export: warning: {problem}; going on as declared (start.preprocess_check: warn)")
    return result

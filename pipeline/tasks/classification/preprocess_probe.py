"""The preprocessing a model was trained with, found rather than guessed: a model brought as ONNX does not say how its
images were resized, cropped, scaled and normalised, and a wrong guess is the most common reason a deployed model
loses accuracy. A library: the export stage runs it on an ONNX start before the ladder enters.

The model is scored on a seeded slice of the *training* split (the ladder's test split is never used to choose) under
the declared preprocessing and under the plausible others, one factor changed at a time (the resize's filter, the
crop, RGB or BGR, the scale and normalisation), then the best of each factor that helped, combined. When one scores higher than
the declared beyond noise (McNemar's exact test on the same images, p < :data:`ALPHA` over two looks: 256 images,
then 512 where the first is inconclusive), the stage stops with both scores and the recipe keys that select it, or
goes on with a warning where the recipe says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from device.preprocess import Preprocess
from pipeline.tasks.classification.images import data_set, preprocess_of

ALPHA = 0.05
SLICE_IMAGES = 256
CROP_PCT = 0.875  # timm's and torchvision's evaluation crop: the shorter side to input_size / 0.875, then the centre
NORMALISATIONS = {  # on the 0–1 scale; "0–255" divides std by 255, so the network sees raw pixel values
    "ImageNet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "0.5/0.5": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "none (0–1)": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    "none (0–255)": ((0.0, 0.0, 0.0), (1 / 255, 1 / 255, 1 / 255)),
    "ImageNet mean on 0–255 (Keras)": ((0.485, 0.456, 0.406), (1 / 255, 1 / 255, 1 / 255)),
    "ImageNet mean in BGR order on 0–255 (Caffe)": ((0.406, 0.456, 0.485), (1 / 255, 1 / 255, 1 / 255)),
}
FILTERS = ("bilinear", "bilinear_antialias", "area", "bicubic")
FIELDS = {"interpolation": ("interpolation",), "crop": ("resize",), "channel order": ("channel_order", "mean", "std"),
          "normalisation": ("mean", "std")}


@dataclass(frozen=True)
class Candidate:
    """One preprocessing tried: what differs from the declared one (``label``), and its per-image correctness."""

    label: str
    preprocess: Preprocess
    correct: np.ndarray

    @property
    def top1(self) -> float:
        return float(self.correct.mean())

    def keys(self) -> dict[str, object]:
        """The recipe keys that select this preprocessing."""
        pre = self.preprocess
        return {"preprocess.interpolation": pre.interpolation, "preprocess.resize": pre.resize,
                "preprocess.channel_order": pre.channel_order,
                "preprocess.mean": [round(v, 6) for v in pre.mean], "preprocess.std": [round(v, 6) for v in pre.std]}


def _factors(pre: Preprocess) -> dict[str, list[tuple[str, Preprocess]]]:
    """Each factor's alternatives to the declared preprocessing, one factor changed at a time."""
    channels = pre.channels
    cropped = max(pre.input_size, int(round(pre.input_size / CROP_PCT)))
    crops = [(f"shorter side {size} then crop {pre.input_size}" if size > pre.input_size else
              f"shorter side {pre.input_size}, no crop margin", replace(pre, resize=size))
             for size in dict.fromkeys((cropped, pre.input_size)) if size != pre.resize]
    norms = []
    for name, (mean, std) in NORMALISATIONS.items():
        mean = mean[:channels] if channels == 3 else (float(np.mean(mean)),)
        std = std[:channels] if channels == 3 else (float(np.mean(std)),)
        if not (np.allclose(mean, pre.mean) and np.allclose(std, pre.std)):
            norms.append((f"{name} normalisation", replace(pre, mean=tuple(mean), std=tuple(std))))
    other = "rgb" if pre.channel_order == "bgr" else "bgr"
    # A BGR model's mean and std are in BGR order: the order flipped with them, and alone.
    orders = [(f"{other.upper()} channel order", replace(pre, channel_order=other)),
              (f"{other.upper()} channel order, mean and std reversed",
               replace(pre, channel_order=other, mean=pre.mean[::-1], std=pre.std[::-1]))] if channels == 3 else []
    return {"interpolation": [(f"{f} resize", replace(pre, interpolation=f)) for f in FILTERS
                              if f != pre.interpolation],
            "crop": crops, "channel order": orders[:1 if pre.mean == pre.mean[::-1] and pre.std == pre.std[::-1]
                                                     else 2], "normalisation": norms}


def probe(declared: Preprocess, images: list[np.ndarray], labels: np.ndarray,
          score: Callable[[np.ndarray], np.ndarray], alpha: float = ALPHA) -> dict:
    """Scores ``score`` (normalised N×C×H×W float32 → logits) under the declared preprocessing and the others.

    Args:
        images: The slice's images as decoded (uint8, their own sizes): each preprocessing starts from them.
        labels: Their classes.

    Returns:
        ``{"declared": {...}, "best": {...}, "p_value", "better", "tried": [{label, top1}], "images"}``; ``better`` is
        True when the best scores higher than the declared beyond noise (``p_value``: McNemar's, Bonferroni-adjusted
        for the number of alternatives tried).
    """
    from pipeline.stats import mcnemar_exact

    def run(label: str, pre: Preprocess) -> Candidate:
        batch = pre.normalize(np.stack([pre.geometry(image) for image in images]))
        logits = np.concatenate([score(batch[i:i + 64]) for i in range(0, len(batch), 64)])
        return Candidate(label, pre, logits.argmax(1) == labels)

    base = run("declared", declared)
    tried = [base]
    improved = {}
    for factor, alternatives in _factors(declared).items():
        scored = [run(label, pre) for label, pre in alternatives]
        tried += scored
        best = max(scored, key=lambda c: c.top1, default=None)
        if best is not None and best.top1 > base.top1:
            improved[factor] = best
    if len(improved) > 1:  # the helpful changes together
        merged = declared
        for factor, candidate in improved.items():
            merged = replace(merged, **{name: getattr(candidate.preprocess, name) for name in FIELDS[factor]})
        tried.append(run(" + ".join(c.label for c in improved.values()), merged))
    best = max(tried, key=lambda c: c.top1)
    only_best = int((best.correct & ~base.correct).sum())
    only_declared = int((base.correct & ~best.correct).sum())
    # The best of several is tested against the declared: Bonferroni over the alternatives tried.
    p_value = min(1.0, mcnemar_exact(only_best, only_declared) * (len(tried) - 1)) if best is not base else 1.0
    return {"images": len(images), "declared": {"top1": base.top1, **base.keys()},
            "best": {"label": best.label, "top1": best.top1, **best.keys()}, "p_value": p_value,
            "better": best is not base and best.top1 > base.top1 and p_value < alpha,
            "tried": [{"label": c.label, "top1": c.top1} for c in tried]}


def check_model(ctx, score: Callable[[np.ndarray], np.ndarray], check: str, what: str, key: str) -> dict | None:
    """Probes a run's model (``score``) on a seeded slice of the run's training split; stops with
    :class:`device.errors.StageError` or warns (``check``: the recipe's ``key``) when another preprocessing beats the
    declared one. Returns the probe's record, None when ``check`` is off."""
    from device.errors import StageError

    if check == "off":
        return None
    split = data_set(ctx).train
    order = np.random.default_rng(ctx.recipe.data.seed).permutation(len(split))
    # Two looks, each at half the level (Bonferroni over the looks): a loss of a few points is 8 or so discordant
    # images of 256, where McNemar's p sat at the threshold (0.04 with AVX-512 kernels, 0.09 with AVX2 ones, the
    # same model); an inconclusive first look is taken again on twice the images, at twice the cost only then.
    for look, count in enumerate((SLICE_IMAGES, 2 * SLICE_IMAGES)):
        chosen = np.sort(order[:count])
        result = probe(preprocess_of(ctx), [split.image(int(i)) for i in chosen], split.labels[chosen], score,
                       alpha=ALPHA / 2)
        if result["better"] or result["p_value"] >= 4 * ALPHA or count >= len(split) or look:
            break
        ctx.log(f"{what}: preprocessing probe on {count} training images inconclusive (p = {result['p_value']:.2g}): "
                f"again on {min(2 * count, len(split))}")
    ctx.log(f"{what}: preprocessing probe on {result['images']} training images: declared "
            f"{100 * result['declared']['top1']:.1f}%, best {result['best']['label']} "
            f"{100 * result['best']['top1']:.1f}% (p = {result['p_value']:.2g})")
    if result["better"]:
        problem, fix = advice(result, key)
        if check == "stop":
            raise StageError(problem, fix=fix)
        ctx.log(f"{what}: warning: {problem}; going on with the declared preprocessing ({key}: warn)")
    return result


def advice(result: dict, key: str = "start.preprocess_check") -> tuple[str, str]:
    """(the problem, the fix) of a probe whose best beat the declared preprocessing."""
    declared, best = result["declared"], result["best"]
    changed = {name: value for name, value in best.items()
               if name.startswith("preprocess.") and declared[name] != value}
    sets = " ".join(f"{name}={_yaml(value)}" for name, value in changed.items())
    problem = (f"the model scores {100 * declared['top1']:.1f}% under the declared preprocessing and "
               f"{100 * best['top1']:.1f}% with {best['label']} on {result['images']} training images "
               f"(McNemar p = {result['p_value']:.2g}, adjusted): it was probably trained with another preprocessing")
    frame = (f"; {best['preprocess.interpolation']} has no in-graph form: deploy.frame then times its preprocessing "
             "on the CPU only"
             if best["preprocess.interpolation"] in ("area", "bicubic", "bilinear_antialias") else "")
    fix = f"set SET='{sets}' (or those keys in the recipe's preprocess section); or {key}: warn to go on with the " \
          f"declared one{frame}"
    return problem, fix


def _yaml(value) -> str:
    return "[" + ",".join(f"{v:g}" for v in value) + "]" if isinstance(value, (list, tuple)) else str(value)

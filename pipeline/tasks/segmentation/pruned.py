"""Segmentation's part of the prune stage (:class:`pipeline.train.hooks.PruneHooks`): every convolution's channels
pruned at one ratio, bisected on copies until the MACs reach the target; the classifiers (one output channel per
class) kept whole, as Torch-Pruning's own segmentation examples keep the final classifier."""

from __future__ import annotations

import copy

from pipeline.core.log import log
from pipeline.tasks.segmentation.training import SegmentationModels, recorded_classes, test_split
from pipeline.train.hooks import PruneHooks, Scored


def _pruned_copy(model, arch: str, ratio: float, size: int, round_to: int, importance: str):
    import torch

    from pipeline.prune.importance import estimator, torch_pruning
    from pipeline.tasks.segmentation.models import SEGMENTERS

    model.eval()
    if ratio > 0:
        tp = torch_pruning()
        tp.pruner.MetaPruner(model, torch.zeros(1, 3, size, size), importance=estimator(importance),
                             pruning_ratio=ratio, iterative_steps=1, round_to=round_to,
                             ignored_layers=SEGMENTERS.get(arch).classifiers(model)).step()
    return model


class SegmentationPrune(SegmentationModels, PruneHooks):
    """Segmentation's pruning: see the module's docstring."""

    def keys(self, ctx, stage):
        return {"input_size": ctx.recipe.input_size()}

    def prune(self, ctx, start, workdir):
        from device.errors import StageError
        from pipeline.models import count_macs
        from pipeline.prune.ratio import bisect_target

        cfg, arch, size = ctx.recipe.prune, start.saved["arch"], start.saved["input_size"]
        shape = (1, 3, size, size)
        base = count_macs(start.model.eval(), shape)

        def fraction(ratio: float) -> float:
            pruned = _pruned_copy(copy.deepcopy(start.model), arch, ratio, size, cfg.round_to, cfg.importance)
            return count_macs(pruned, shape) / base

        tried = bisect_target(fraction, 0.0, 0.95, cfg.macs_target, cfg.tolerance * cfg.macs_target, cfg.iterations)
        ratio, achieved = min(tried, key=lambda kv: abs(kv[1] - cfg.macs_target))
        if abs(achieved - cfg.macs_target) > cfg.tolerance * cfg.macs_target:
            raise StageError(f"{arch}: pruning reaches {achieved:.1%} of the MACs at best, not the target "
                             f"{cfg.macs_target:.1%} within {cfg.tolerance:.0%}",
                             fix=f"set prune.macs_target near {achieved:.2f}, or loosen prune.tolerance")
        _pruned_copy(start.model, arch, ratio, size, cfg.round_to, cfg.importance)
        result = {"ratio": float(ratio), "base_macs": int(base), "macs": int(count_macs(start.model, shape)),
                  "input_size": size}
        result["fraction"] = result["macs"] / base
        log(f"prune: channel ratio {ratio:.3f}, classifiers kept whole")
        start.saved["pruned"] = result
        return {"pruning": result, "macs_fraction": result["fraction"]}

    def assess(self, ctx, start, workdir):
        from pipeline.tasks.segmentation.metrics import score_masks
        from pipeline.tasks.segmentation.train import predict

        test = test_split(ctx)
        scores = score_masks(test.masks, predict(start.model, test.images), recorded_classes(ctx))
        # Not gated: a pruned segmenter before fine-tuning may well find nothing yet; distillation restores it.
        objects = [v for v in list(scores["per_class_iou"].values())[1:] if v]
        return Scored({**scores, "sanity": "ok" if objects else "finds no object before fine-tuning"})

    def summary(self, stage, metrics):
        if stage != "prune":
            return super().summary(stage, metrics)
        return (f"{100 * metrics['macs_fraction']:.1f}% of the teacher's MACs, mIoU before fine-tuning "
                f"{100 * metrics['miou']:.1f}")

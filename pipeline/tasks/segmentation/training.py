"""Segmentation's part of the teacher stage, and what its prune and distill stages share with it
(:class:`pipeline.train.hooks.ModelHooks`): the segmenters of :mod:`pipeline.tasks.segmentation.models`, trained
with pixel-wise cross-entropy on the shared engine, scored by mIoU with its interval over test images. The student
and the distillation loss are in :mod:`pipeline.tasks.segmentation.distilling`."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core import distributed
from pipeline.train.hooks import ModelHooks, Scored, Start

_WHAT = {"teacher": "the teacher", "distill": "the distilled student"}


def recorded_classes(ctx) -> list[str]:
    """The classes the data stage recorded, in label order."""
    return json.loads(ctx.manifest.output("data", "dataset").read_text())["classes"]


def test_split(ctx):
    from pipeline.tasks.segmentation.data import load_split

    return load_split(ctx.manifest.output("data", "canvases"), "test")


class SegmentationModels(ModelHooks):
    """Segmentation's teacher, and what its student shares with it: see the module's docstring."""

    def check_teacher(self, ctx):
        from device.errors import CheckpointError

        weights = ctx.recipe.teacher.weights
        if weights and not Path(weights).is_file():
            raise CheckpointError(f"teacher.weights {weights} does not exist",
                                  fix="pass a state_dict of the teacher's architecture (WEIGHTS=path), or null to "
                                      "train")

    def teacher(self, ctx):
        from pipeline.tasks.segmentation.models import build_segmenter, load_segmenter_weights

        cfg, classes, size = ctx.recipe.teacher, recorded_classes(ctx), ctx.recipe.input_size()
        model = build_segmenter(cfg.arch, len(classes))
        if cfg.weights:
            load_segmenter_weights(model, cfg.weights)
        return Start(model, {"arch": cfg.arch, "num_classes": len(classes), "input_size": size})

    def checkpoint(self, ctx, stage):
        from pipeline.tasks.segmentation.models import load_segmenter

        model, meta = load_segmenter(ctx.manifest.output(stage, "model"))
        # What the stage recorded beside the state (the prune plan) travels on to the next checkpoint.
        return Start(model, {**meta["meta"], **{key: meta[key] for key in ("arch", "num_classes", "input_size")}})

    def train(self, ctx, start, cfg, stage, teacher=None):
        from pipeline.tasks.segmentation.data import load_split
        from pipeline.tasks.segmentation.train import train_segmenter

        return train_segmenter(start.model, load_split(ctx.manifest.output("data", "canvases"), "train"), cfg, stage,
                               resume=ctx.resume, device=ctx.device)

    def finish(self, ctx, start, cfg, stage, workdir, teacher=None):
        import numpy as np

        from pipeline.tasks.segmentation.metrics import require_sane, score_masks
        from pipeline.tasks.segmentation.train import predict

        if not distributed.world().main:  # the runner records rank 0's result alone
            return Scored({})
        test = test_split(ctx)
        masks = predict(start.model, test.images)
        scores = score_masks(test.masks, masks, recorded_classes(ctx))
        require_sane(scores, _WHAT.get(stage, stage))
        np.save(workdir / "masks.npy", masks, allow_pickle=False)  # the per-class tests compare these
        return Scored(scores, {"masks": workdir / "masks.npy"})

    def save(self, path, start):
        from pipeline.tasks.segmentation.models import save_segmenter

        saved = dict(start.saved)
        return save_segmenter(path, start.model, saved.pop("arch"), saved.pop("num_classes"), saved.pop("input_size"),
                              **saved)

    def size(self, ctx, start):
        from pipeline.tasks.segmentation.models import size_metrics

        return size_metrics(start.model, start.saved["input_size"])

    def summary(self, stage, metrics):
        score = f"mIoU {100 * metrics['miou']:.1f} [{100 * metrics['miou_low']:.1f}, {100 * metrics['miou_high']:.1f}]"
        if stage == "teacher":
            return f"{score}, {metrics['params_m']:.3f} M params, {metrics['macs_g']:.4f} GMACs"
        return f"{score}, {metrics['macs_g']:.4f} GMACs" + ("" if metrics.get("with_teacher", True)
                                                             else " (fine-tuned without the teacher)")

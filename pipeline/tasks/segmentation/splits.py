"""Segmentation's part of the data stage (:class:`pipeline.core.data.hooks.DataHooks`): the synthetic set made once
(seeded, its parameters recorded), every class present in both splits."""

from __future__ import annotations

from pipeline.core.data.hooks import DataHooks, Splits


class SegmentationData(DataHooks):
    """Draws the canvases and their masks (:mod:`pipeline.tasks.segmentation.data`)."""

    def split(self, ctx, workdir):
        from pipeline.tasks.segmentation.data import CLASSES, make_set, save_splits

        cfg = ctx.recipe.data
        splits = make_set(cfg)
        save_splits(workdir / "canvases.npz", splits)
        pixels = {name: [int((split.masks == k).sum()) for k in range(len(CLASSES))] for name, split in splits.items()}
        generator = {"size": cfg.size, "objects": list(cfg.objects), "texture": cfg.texture, "seed": cfg.seed}
        return Splits(cfg.source, list(CLASSES), {"canvases": workdir / "canvases.npz"},
                      {"train": len(splits["train"]), "test": len(splits["test"]), "pixels": pixels,
                       "generator": generator}, {"generator": generator})

    def summary(self, metrics):
        shapes = sum(metrics["pixels"]["test"][1:]) / max(1, sum(metrics["pixels"]["test"]))
        return (f"{metrics['source']}: {metrics['num_classes']} classes, {metrics['train']} train / {metrics['test']} "
                f"test canvases, {100 * shapes:.0f}% of test pixels on shapes")

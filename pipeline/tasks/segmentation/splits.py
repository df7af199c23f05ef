"""Segmentation's part of the data stage (:class:`pipeline.core.data.hooks.DataHooks`): the synthetic set made once
(seeded, its parameters recorded), every class present in both splits; or a user's ``voc:`` / ``cityscapes:`` folder
checked whole (:mod:`pipeline.tasks.segmentation.folders`)."""

from __future__ import annotations

from pipeline.core.data.hooks import DataHooks, Splits


class SegmentationData(DataHooks):
    """Draws the canvases and their masks (:mod:`pipeline.tasks.segmentation.data`), or reads a user's folder."""

    def keys(self, ctx):
        """A folder's files by name and size (an edited mask under the same name makes the set again)."""
        source = ctx.recipe.data.source
        if source.partition(":")[0] not in ("voc", "cityscapes"):
            return {}
        import hashlib

        from pipeline.tasks.segmentation.folders import layout_files

        digest = hashlib.sha256()
        for pairs in layout_files(source).values():
            for item, image, mask in pairs:
                sizes = [path.stat().st_size if path.is_file() else -1 for path in (image, mask)]
                digest.update(f"{item}:{sizes}\n".encode())
        return {"files_sha256": digest.hexdigest()}

    def split(self, ctx, workdir):
        from pipeline.tasks.segmentation.data import make_set, save_splits
        from pipeline.tasks.segmentation.folders import read_layout

        cfg = ctx.recipe.data
        if cfg.source.partition(":")[0] in ("voc", "cityscapes"):
            classes, splits = read_layout(cfg.source, cfg.train_images, cfg.test_images, cfg.size, cfg.seed)
            absent = [classes[k] for k in range(len(classes)) if not (splits["test"].masks == k).any()]
            if absent:  # scored as absent (mIoU is over the classes in the truth or the prediction), and said so
                ctx.log(f"data: no {', '.join(absent)} pixel in the test split of {len(splits['test'])} images")
        else:
            classes, splits = make_set(cfg)
        save_splits(workdir / "canvases.npz", splits)
        pixels = {name: [int((split.masks == k).sum()) for k in range(len(classes))] for name, split in splits.items()}
        generator = {"size": cfg.size, "objects": list(cfg.objects), "texture": cfg.texture, "seed": cfg.seed}
        return Splits(cfg.source, list(classes), {"canvases": workdir / "canvases.npz"},
                      {"train": len(splits["train"]), "test": len(splits["test"]), "pixels": pixels,
                       "generator": generator}, {"generator": generator})

    def summary(self, metrics):
        present = sum(1 for pixels in metrics["pixels"]["test"] if pixels)
        return (f"{metrics['source']}: {metrics['num_classes']} classes ({present} in the test split), "
                f"{metrics['train']} train / {metrics['test']} test images")

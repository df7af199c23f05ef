"""Detection's part of the data stage (:class:`pipeline.core.data.hooks.DataHooks`): the composited canvas set made
once (seeded, its generator recorded), or the user's COCO set checked, split by seed and letterboxed to the recipe's
square (``data.canvas.size``)."""

from __future__ import annotations

from device.errors import DataError
from device.files import sha256_file
from pipeline.core.data.hooks import DataHooks, Splits


class DetectionData(DataHooks):
    """Composites the canvas set once (seeded; its generator's parameters recorded), or reads a COCO set."""

    def keys(self, ctx):
        source = ctx.recipe.data.source
        if source.startswith("coco:"):  # an edited annotations file under the same path makes the set again
            from pipeline.tasks.detection.data import parse_coco_argument

            annotations = parse_coco_argument(source.partition(":")[2])[0]
            if annotations.is_file():
                return {"annotations_sha256": sha256_file(annotations)}
        return {}

    def split(self, ctx, workdir):
        from pipeline.tasks.detection.data import coco_set, composited
        from pipeline.tasks.detection.files import save_splits
        from pipeline.tasks.detection.recipe import DETECTION_SOURCES

        cfg = ctx.recipe.data
        if cfg.source.startswith("coco:"):  # every bad annotation named before an image is read
            data = coco_set(cfg.source.partition(":")[2], cfg.train_images, cfg.test_images, cfg.canvas.size, cfg.seed,
                            log=ctx.log, style=cfg.letterbox)
        else:
            data = composited(DETECTION_SOURCES[cfg.source], cfg.train_images, cfg.test_images,
                              cfg.canvas.to_spec(cfg.seed))
        boxes = {name: sum(len(b.labels) for b in split.boxes) for name, split in (("train", data.train),
                                                                                   ("test", data.test))}
        if not all(boxes.values()):
            raise DataError(f"{data.name}: a split came out without boxes ({boxes})",
                            fix="raise data.canvas.objects or the canvas size")
        save_splits(workdir / "canvases.npz", {"train": data.train, "test": data.test})
        return Splits(data.name, data.classes, {"canvases": workdir / "canvases.npz"},
                      {"train": len(data.train), "test": len(data.test), "train_boxes": boxes["train"],
                       "test_boxes": boxes["test"], "generator": data.generator},
                      {"generator": data.generator})

    def summary(self, metrics):
        what = "images" if metrics["source"].startswith("coco:") else "canvases"
        return (f"{metrics['source']}: {metrics['num_classes']} classes, {metrics['train']} train / {metrics['test']} "
                f"test {what}, {metrics['train_boxes']} / {metrics['test_boxes']} boxes")

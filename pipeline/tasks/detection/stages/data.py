"""detection data stage: the composited canvas set made once (seeded, its generator recorded), or the user's COCO
set checked, split by seed and letterboxed to the recipe's square (``data.canvas.size``)."""

from __future__ import annotations

import json
from pathlib import Path

from device.errors import DataError
from device.files import sha256_file
from pipeline.core.stage import Stage, StageResult


class DetectionDataStage(Stage):
    """Composites the canvas set once (seeded; its generator's parameters recorded), or reads a COCO set."""

    name = "data"

    def config(self, ctx):
        config = {"data": ctx.recipe.section("data")}
        source = ctx.recipe.data.source
        if source.startswith("coco:"):  # an edited annotations file under the same path makes the set again
            from pipeline.tasks.detection.data import parse_coco_argument

            annotations = parse_coco_argument(source.partition(":")[2])[0]
            if annotations.is_file():
                config["annotations_sha256"] = sha256_file(annotations)
        return config

    def run(self, ctx, workdir: Path) -> StageResult:
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
        (workdir / "dataset.json").write_text(json.dumps({"source": data.name, "classes": data.classes,
                                                          "generator": data.generator}, indent=2) + "\n")
        return StageResult(outputs={"canvases": workdir / "canvases.npz", "dataset": workdir / "dataset.json"},
                           metrics={"source": data.name, "num_classes": len(data.classes), "train": len(data.train),
                                    "test": len(data.test), "train_boxes": boxes["train"], "test_boxes": boxes["test"],
                                    "generator": data.generator})

    def summary(self, metrics):
        what = "images" if metrics["source"].startswith("coco:") else "canvases"
        return (f"{metrics['source']}: {metrics['num_classes']} classes, {metrics['train']} train / {metrics['test']} "
                f"test {what}, {metrics['train_boxes']} / {metrics['test_boxes']} boxes")

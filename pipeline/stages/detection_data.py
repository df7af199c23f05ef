"""detection data stage: the composited canvas set made once (seeded, its generator recorded), or COCO checked."""

from __future__ import annotations

import json
from pathlib import Path

from device.errors import DataError, StageError
from pipeline.stages.base import Stage, StageResult
from pipeline.stages.detection_base import DETECTION_STAGES


class DetectionDataStage(Stage):
    """Composites the canvas set once (seeded; its generator's parameters recorded), or checks a COCO set."""

    name = "data"

    def config(self, ctx):
        return {"data": ctx.recipe.section("data")}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.data.detection import composited, load_coco
        from pipeline.data.detection_files import save_splits
        from pipeline.detection_recipe import DETECTION_SOURCES

        cfg = ctx.recipe.data
        if cfg.source.startswith("coco:"):
            load_coco(cfg.source.partition(":")[2])  # names every bad annotation before anything else
            raise StageError(f"{cfg.source}: the annotations check out, but training detectors on COCO files is not "
                             "built yet (images of many sizes)", fix="use data.source: fmnist-det or digits-det for now")
        data = composited(DETECTION_SOURCES[cfg.source], cfg.train_images, cfg.test_images, cfg.canvas.to_spec(cfg.seed))
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
        return (f"{metrics['source']}: {metrics['num_classes']} classes, {metrics['train']} train / {metrics['test']} "
                f"test canvases, {metrics['train_boxes']} / {metrics['test_boxes']} boxes")


DETECTION_STAGES.add(DetectionDataStage.name, DetectionDataStage())

"""Detection stages (``task: detection``): data → teacher → prune → distill so far; the rest is not built yet.

They register in their own registry under the classification stages' names, so ``--until`` and ``--force`` take
the same words; the runner picks the registry by the recipe's task and stops with a StageError at the first stage
that detection does not have yet.
"""

from __future__ import annotations

import json
from pathlib import Path

from device.errors import DataError, StageError
from device.registry import Registry
from pipeline.stages.base import Stage, StageResult

DETECTION_STAGES: Registry[Stage] = Registry("detection stage")


def _classes(ctx) -> list[str]:
    return json.loads(ctx.manifest.output("data", "dataset").read_text())["classes"]


def _size_metrics(model, input_size: int) -> dict[str, float]:
    from pipeline.models import count_macs, count_parameters

    return {"params_m": count_parameters(model) / 1e6, "macs_g": count_macs(model, (1, 3, input_size, input_size)) / 1e9,
            "input_size": input_size}


class DetectionDataStage(Stage):
    """Composites the canvas set once (seeded; its generator's parameters recorded), or checks a COCO set."""

    name = "data"

    def config(self, ctx):
        return {"data": ctx.recipe.section("data")}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.data.detection import composited, load_coco
        from pipeline.data.detection_files import save_splits
        from pipeline.recipe import DETECTION_SOURCES

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


class DetectionTeacherStage(Stage):
    """Trains the teacher detector from scratch on CPU or GPU and scores it with COCO mAP and intervals."""

    name = "teacher"

    def preflight(self, ctx):
        if ctx.recipe.teacher.weights:
            raise StageError("teacher.weights for a detector: loading a user's detector is not built yet (its "
                             "FrozenBatchNorm is converted by pipeline.detection_models.unfreeze_batchnorm)",
                             fix="set teacher.weights: null to train the teacher on the data")

    def needs(self, ctx):
        return ("data",)

    def config(self, ctx):
        return {"teacher": ctx.recipe.section("teacher")}

    def run(self, ctx, workdir: Path) -> StageResult:
        import torch

        from pipeline.data.detection_files import load_split
        from pipeline.detection_checkpoint import save_detector
        from pipeline.detection_models import DETECTORS, build_detector
        from pipeline.detection_train import score_detector, train_detector

        cfg, classes = ctx.recipe.teacher, _classes(ctx)
        canvases = ctx.manifest.output("data", "canvases")
        torch.manual_seed(cfg.train.seed)
        model = build_detector(cfg.arch, len(classes), cfg.size())
        offset = DETECTORS.get(cfg.arch).label_offset
        history = train_detector(model, load_split(canvases, "train"), cfg.train, offset, log=ctx.log) \
            if cfg.train.epochs else []
        scores = score_detector(model, load_split(canvases, "test"), classes, "the teacher", offset)
        path = save_detector(workdir / "model.pt", model, cfg.arch, len(classes), cfg.size())
        return StageResult(outputs={"model": path},
                           metrics={**scores, **_size_metrics(model, cfg.size()), "history": history})

    def summary(self, metrics):
        return (f"mAP {100 * metrics['map']:.1f} [{100 * metrics['map_low']:.1f}, {100 * metrics['map_high']:.1f}], "
                f"AP50 {100 * metrics['ap50']:.1f}, {metrics['params_m']:.2f} M params, {metrics['macs_g']:.3f} GMACs")


class DetectionPruneStage(Stage):
    """Prunes the teacher's backbone and neck to the MACs target, the head's anchor-sized layers kept whole."""

    name = "prune"

    def needs(self, ctx):
        return ("data", "teacher")

    def config(self, ctx):
        return {"prune": ctx.recipe.section("prune"), "input_size": ctx.recipe.teacher.size()}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.data.detection_files import load_split
        from pipeline.detection_checkpoint import load_detector, save_detector
        from pipeline.detection_metrics import evaluate, require_sane_detector
        from pipeline.detection_models import DETECTORS
        from pipeline.detection_pruning import prune_detector
        from pipeline.detection_train import predict

        cfg, classes = ctx.recipe.prune, _classes(ctx)
        model, meta = load_detector(ctx.manifest.output("teacher", "model"))
        result = prune_detector(model, meta["arch"], cfg.macs_target, meta["input_size"], round_to=cfg.round_to,
                                importance=cfg.importance, tolerance=cfg.tolerance, iterations=cfg.iterations)
        for kept in result.kept_whole:
            ctx.log(f"prune: kept whole {kept['module']}: {kept['reason']}")
        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        detections = predict(model, test.images, DETECTORS.get(meta["arch"]).label_offset)
        # Not gated: a pruned detector before fine-tuning may well find nothing yet; distillation restores it.
        try:
            require_sane_detector(detections, test.boxes, classes, "the pruned detector (before fine-tuning)")
            sanity = "ok"
        except StageError as err:
            sanity = err.message
            ctx.log(f"prune: note: {sanity}")
        scores = evaluate(test.boxes, detections, classes, [tuple(i.shape[:2]) for i in test.images], resamples=200)
        path = save_detector(workdir / "model.pt", model, meta["arch"], meta["num_classes"], meta["input_size"],
                             pruned=result.to_json())
        return StageResult(outputs={"model": path},
                           metrics={**scores, **_size_metrics(model, meta["input_size"]), "pruning": result.to_json(),
                                    "macs_fraction": result.fraction, "sanity": sanity})

    def summary(self, metrics):
        return (f"{100 * metrics['macs_fraction']:.1f}% of the teacher's MACs ({len(metrics['pruning']['kept_whole'])} "
                f"head layers kept whole), mAP before fine-tuning {100 * metrics['map']:.1f}")


class DetectionDistillStage(Stage):
    """Fine-tunes the pruned detector with the teacher: its own detection loss + class KD + feature imitation."""

    name = "distill"

    def needs(self, ctx):
        return ("data", "teacher", "prune")

    def config(self, ctx):
        return {"distill": ctx.recipe.section("distill")}

    def run(self, ctx, workdir: Path) -> StageResult:
        import torch

        from pipeline.data.detection_files import load_split
        from pipeline.detection_checkpoint import load_detector, save_detector
        from pipeline.detection_distill import DetectionDistillLoss
        from pipeline.detection_metrics import class_changes
        from pipeline.detection_models import DETECTORS
        from pipeline.detection_train import predict, score_detector, targets, train_detector

        cfg, classes = ctx.recipe.distill, _classes(ctx)
        teacher, meta = load_detector(ctx.manifest.output("teacher", "model"))
        student, _ = load_detector(ctx.manifest.output("prune", "model"))
        spec = DETECTORS.get(meta["arch"])
        canvases = ctx.manifest.output("data", "canvases")
        torch.manual_seed(cfg.train.seed)
        teaching = cfg.kd_weight > 0 or cfg.feature_weight > 0
        loss = DetectionDistillLoss(student, teacher, "softmax" if spec.label_offset else "sigmoid",
                                    cfg.temperature, cfg.kd_weight, cfg.feature_weight, meta["input_size"]) \
            if teaching else None
        student.train()
        history = train_detector(student, load_split(canvases, "train"), cfg.train, spec.label_offset, log=ctx.log,
                                 extra_loss=(lambda x, batch: loss(student, teacher, x, batch)["total"]) if loss else None,
                                 extra_modules=loss)
        test = load_split(canvases, "test")
        scores = score_detector(student, test, classes, "the distilled student", spec.label_offset)
        changes = class_changes(test.boxes, predict(teacher, test.images, spec.label_offset),
                                predict(student, test.images, spec.label_offset), classes, resamples=200)
        path = save_detector(workdir / "model.pt", student, meta["arch"], meta["num_classes"], meta["input_size"],
                             distilled=teaching)
        return StageResult(outputs={"model": path},
                           metrics={**scores, **_size_metrics(student, meta["input_size"]), "history": history,
                                    "with_teacher": teaching, "class_changes_vs_teacher": changes})

    def summary(self, metrics):
        return (f"mAP {100 * metrics['map']:.1f} [{100 * metrics['map_low']:.1f}, {100 * metrics['map_high']:.1f}], "
                f"AP50 {100 * metrics['ap50']:.1f}, {metrics['macs_g']:.3f} GMACs"
                + ("" if metrics["with_teacher"] else " (fine-tuned without the teacher)"))


for _stage in (DetectionDataStage(), DetectionTeacherStage(), DetectionPruneStage(), DetectionDistillStage()):
    DETECTION_STAGES.add(_stage.name, _stage)

"""detection teacher stage: the teacher detector trained on the canvases and scored with COCO mAP and intervals."""

from __future__ import annotations

from pathlib import Path

from pipeline.tasks.detection.models import detector_size_metrics
from pipeline.core import distributed
from pipeline.core.stage import Stage, StageResult, started_without_torch
from pipeline.tasks.detection.files import recorded_classes


class DetectionTeacherStage(Stage):
    """The teacher detector, from a user's state_dict or trained from scratch, scored with COCO mAP and intervals."""

    name = "teacher"
    distributed = True  # trains under torchrun on every rank (DDP); rank 0 scores and writes the checkpoint

    def absent(self, ctx):
        return started_without_torch(ctx.recipe)

    def preflight(self, ctx):
        from device.errors import CheckpointError

        weights = ctx.recipe.teacher.weights
        if weights and not Path(weights).is_file():  # before the data stage, not after it
            raise CheckpointError(f"teacher.weights {weights} does not exist",
                                  fix="pass a torchvision detector state_dict (WEIGHTS=path), or null to train")

    def needs(self, ctx):
        return ("data",)

    def config(self, ctx):
        from device.files import sha256_file

        weights = ctx.recipe.teacher.weights
        # The weights file's bytes, not its name, decide whether the teacher is still valid.
        return {"teacher": ctx.recipe.section("teacher"),
                "weights_sha256": sha256_file(weights) if weights and Path(weights).is_file() else None}

    def run(self, ctx, workdir: Path) -> StageResult:
        import torch

        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.checkpoint import load_detector_weights, save_detector
        from pipeline.tasks.detection.models import DETECTORS, build_detector
        from pipeline.tasks.detection.train import score_detector, train_detector

        cfg, classes = ctx.recipe.teacher, recorded_classes(ctx)
        canvases = ctx.manifest.output("data", "canvases")
        torch.manual_seed(cfg.train.seed)
        model = build_detector(cfg.arch, len(classes), cfg.size())
        replaced = load_detector_weights(model, cfg.arch, cfg.weights) if cfg.weights else []
        if replaced:
            ctx.log(f"teacher: head re-initialised for {len(classes)} classes ({', '.join(replaced)})")
        offset = DETECTORS.get(cfg.arch).label_offset
        # On the run's device (under torchrun each rank's, where NCCL needs CUDA tensors); scored on the CPU.
        history = [] if not cfg.train.epochs else train_detector(
            model, load_split(canvases, "train"), cfg.train, offset, "teacher", resume=ctx.resume,
            input_size=cfg.size(), device=ctx.device)
        path = save_detector(workdir / "model.pt", model, cfg.arch, len(classes), cfg.size())
        if not distributed.world().main:  # the runner records rank 0's result alone
            return StageResult(outputs={"model": path})
        scores = score_detector(model, load_split(canvases, "test"), classes, "the teacher", offset)
        return StageResult(outputs={"model": path},
                           metrics={**scores, **detector_size_metrics(model, cfg.size()), "history": history,
                                    "weights": cfg.weights, "replaced_head": replaced})

    def summary(self, metrics):
        return (f"mAP {100 * metrics['map']:.1f} [{100 * metrics['map_low']:.1f}, {100 * metrics['map_high']:.1f}], "
                f"AP50 {100 * metrics['ap50']:.1f}, {metrics['params_m']:.2f} M params, {metrics['macs_g']:.3f} GMACs")

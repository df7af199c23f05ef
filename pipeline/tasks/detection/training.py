"""Detection's part of the teacher stage, and what its distill stage shares with it
(:class:`pipeline.train.hooks.ModelHooks`): torchvision detectors (a user's state_dict for the teacher, the head
re-initialised for another class count), trained with their own detection losses, scored by COCO mAP with its
interval. The student and the distillation loss are in :mod:`pipeline.tasks.detection.distilling`."""

from __future__ import annotations

from pathlib import Path

from pipeline.core import distributed
from pipeline.tasks.detection.files import recorded_classes
from pipeline.train.hooks import ModelHooks, Scored, Start

_WHAT = {"teacher": "the teacher", "distill": "the distilled student"}


class DetectionModels(ModelHooks):
    """Detection's teacher, and what its student shares with it: see the module's docstring."""

    def check_teacher(self, ctx):
        from device.errors import CheckpointError

        weights = ctx.recipe.teacher.weights
        if weights and not Path(weights).is_file():
            raise CheckpointError(f"teacher.weights {weights} does not exist",
                                  fix="pass a torchvision detector state_dict (WEIGHTS=path), or null to train")

    def teacher(self, ctx):
        from pipeline.tasks.detection.checkpoint import load_detector_weights
        from pipeline.tasks.detection.models import build_detector

        cfg, classes = ctx.recipe.teacher, recorded_classes(ctx)
        model = build_detector(cfg.arch, len(classes), cfg.size())
        replaced = load_detector_weights(model, cfg.arch, cfg.weights) if cfg.weights else []
        return Start(model, {"arch": cfg.arch, "num_classes": len(classes), "input_size": cfg.size()}, replaced)

    def checkpoint(self, ctx, stage):
        from pipeline.tasks.detection.checkpoint import load_detector

        model, meta = load_detector(ctx.manifest.output(stage, "model"))
        return Start(model, {key: meta[key] for key in ("arch", "num_classes", "input_size")})

    def train(self, ctx, start, cfg, stage, teacher=None):
        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.train import train_detector

        # On the run's device (under torchrun each rank's, where NCCL needs CUDA tensors); scored on the CPU.
        return train_detector(start.model, load_split(ctx.manifest.output("data", "canvases"), "train"), cfg,
                              label_offset(start), stage, resume=ctx.resume, input_size=start.saved["input_size"],
                              device=ctx.device)

    def finish(self, ctx, start, cfg, stage, workdir, teacher=None):
        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.train import score_detector

        if not distributed.world().main:  # the runner records rank 0's result alone
            return Scored({})
        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        return Scored(score_detector(start.model, test, recorded_classes(ctx), _WHAT[stage], label_offset(start)))

    def save(self, path, start):
        from pipeline.tasks.detection.checkpoint import save_detector

        saved = dict(start.saved)
        return save_detector(path, start.model, saved.pop("arch"), saved.pop("num_classes"), saved.pop("input_size"),
                             **saved)

    def size(self, ctx, start):
        from pipeline.tasks.detection.models import detector_size_metrics

        return detector_size_metrics(start.model, start.saved["input_size"])

    def summary(self, stage, metrics):
        score = (f"mAP {100 * metrics['map']:.1f} [{100 * metrics['map_low']:.1f}, {100 * metrics['map_high']:.1f}], "
                 f"AP50 {100 * metrics['ap50']:.1f}")
        if stage == "teacher":
            return f"{score}, {metrics['params_m']:.2f} M params, {metrics['macs_g']:.3f} GMACs"
        return f"{score}, {metrics['macs_g']:.3f} GMACs" + ("" if metrics["with_teacher"]
                                                            else " (fine-tuned without the teacher)")


def label_offset(start: Start) -> int:
    """1 where the detector's class 0 is the background (its labels are the data's plus one)."""
    from pipeline.tasks.detection.models import DETECTORS

    return DETECTORS.get(start.saved["arch"]).label_offset

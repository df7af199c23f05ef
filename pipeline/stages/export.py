"""export stage, the same for every task: each rung's checkpoint as ONNX checked against torch on test images, or
the user's ONNX start in the ladder's form as the student, then the forms derived from them. The task supplies how
its networks are written and checked (:class:`pipeline.export.hooks.ExportHooks`)."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.stage import HookedStage, StageResult
from pipeline.export.hooks import Exported, ExportHooks


class ExportStage(HookedStage):
    """The ladder's ONNX graphs, each checked against the network it was written from.

    Args:
        hooks: The task's part (:class:`~pipeline.export.hooks.ExportHooks`).
    """

    name = "export"
    hooks: ExportHooks

    def preflight(self, ctx):
        if ctx.recipe.start is not None:  # the user's file is checked before any work
            self.hooks.inspect_start(ctx)

    def needs(self, ctx):
        if ctx.recipe.start is not None:
            return ("data",)
        return ("data", *dict.fromkeys(self.hooks.rungs(ctx).values()))

    def config(self, ctx):
        import torch

        config = {"export": ctx.recipe.section("export"), "torch": torch.__version__, **self.hooks.keys(ctx)}
        if ctx.recipe.start is not None:  # the user's file by its bytes: a re-exported model.onnx is taken again
            from pipeline.export.onnx_start import start_sha256

            config["start"] = {**ctx.recipe.section("start"), "sha256": start_sha256(Path(ctx.recipe.start.onnx))}
        return config

    def run(self, ctx, workdir: Path) -> StageResult:
        probe = self.hooks.probe(ctx)
        started = ctx.recipe.start is not None
        if started:
            exported = self.hooks.started(ctx, workdir, probe)
        else:
            exported = Exported()
            for rung, stage in self.hooks.rungs(ctx).items():
                exported.add(self.hooks.export(ctx, rung, stage, workdir, probe))
        self.hooks.finish(ctx, workdir, exported)
        return StageResult(outputs=exported.outputs,
                           metrics={"rungs": exported.rungs, **({"started": True} if started else {})})

    def summary(self, metrics):
        return self.hooks.summary(metrics)

"""quantize stage, the same for every task: the student to INT8 with explicit Q/DQ through the ladder every task
climbs (:func:`pipeline.quantize.ladder.climb`: each calibration method in the recipe's order, the most sensitive
layers kept in float, then QAT), gated on the task's score against the FP32 student.

The task gives its ladder and what it records of the accepted candidate
(:class:`pipeline.quantize.ladder.QuantizeHooks`): which nodes stay float and in which precision, how a candidate is
scored, what else the INT8 rung carries.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.stage import HookedStage, StageResult
from pipeline.quantize.ladder import QuantizeHooks, climb, scratch_copy, steps


class QuantizeStage(HookedStage):
    """The INT8 student, linted, int8 weights checked, within the task's budget of its FP32 form.

    Args:
        hooks: The task's part (:class:`~pipeline.quantize.ladder.QuantizeHooks`).
    """

    name = "quantize"
    hooks: QuantizeHooks

    def needs(self, ctx):
        # Quantization-aware fine-tuning starts from the distilled checkpoint, not from the ONNX.
        qat = ("distill",) if ctx.recipe.quantize.qat else ()
        return tuple(dict.fromkeys(("data", "export") + qat + self.hooks.needs(ctx)))

    def config(self, ctx):
        return {"quantize": ctx.recipe.section("quantize"), **self.hooks.config(ctx)}

    def run(self, ctx, workdir: Path) -> StageResult:
        cfg = ctx.recipe.quantize
        with scratch_copy(workdir, ctx.manifest.output("export", "student"), self.hooks.scratch_name) as fp32:
            task = self.hooks.ladder(ctx, workdir, fp32)
            reference, attempts, candidate = climb(
                task, steps(cfg.quantizer, cfg.calibration_methods, bool(cfg.qat), bool(cfg.mixed_precision)),
                workdir, cfg.mixed_precision)
            return self.hooks.finish(ctx, workdir, task, reference, attempts, candidate)

    def summary(self, metrics):
        return self.hooks.summary(metrics)

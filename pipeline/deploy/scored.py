"""The deploy hooks every task whose device scores its rungs through its own post-processor shares (detection,
segmentation): each rung's record from its typed rounds with its ratio to the FP32 student, the sustained run after
the ladder, and what ``results.json`` holds beside the devices. A task adds what it sends and how it scores what
comes back (:meth:`ScoredDeploy.rung_record`)."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any

from pipeline.deploy.hooks import DeployHooks


class ScoredDeploy(DeployHooks):
    """A scored task's part of the deploy stage. Its plan has at least ``artifacts`` (``{rung: Path}``), ``ladder``
    (the evaluate stage's record), ``count`` (the test split's first images the device scores) and ``frames``
    (:class:`pipeline.deploy.frames.FrameFiles` with ``deploy.frame``, else None)."""

    @abstractmethod
    def rung_record(self, ctx, rung: str, rounds: list[dict[str, Any]], plan) -> dict[str, Any]:
        """A rung's record from its typed rounds (round 1 scored the set): its device-measured score and timings
        (:func:`pipeline.deploy.records.timed_record`), or why it has none."""

    def record(self, ctx, outcome, plan, rounds):
        from pipeline.deploy.records import ratios_to_student, typed_rounds

        reused = outcome.get("reused", [])
        for job, records in rounds.items():
            if records:
                typed = typed_rounds(records, f"{job.rung} on {outcome['name']}")
                outcome["rungs"][job.rung] = self.rung_record(ctx, job.rung, typed, plan)
                outcome["rungs"][job.rung]["reused_rounds"] = reused.count(job.rung)
        ratios_to_student(outcome["rungs"])

    def after(self, ctx, plan, outcome, open_session):
        from pipeline.deploy.sustained import sustained_run

        if ctx.recipe.deploy.sustained is not None:  # after the ladder's windows: the board heats under it alone
            outcome["sustained"] = sustained_run(ctx, plan.artifacts, outcome, open_session,
                                                 lambda session, rung, path: sustained_job(ctx, session, rung, path,
                                                                                           plan.ladder))

    def results(self, ctx, plan):
        # The set is the test split's first images: edgefold diverge rebuilds them by these indices.
        return {"images": plan.count, "evaluation": {"images": plan.count, "indices": list(range(plan.count))},
                "frame": plan.frames.record("deploy") if plan.frames else None}


def sustained_job(ctx, session, rung: str, path: Path, ladder: dict[str, Any]):
    """A scored task's sustained job (``deploy.sustained``): the rung at its one batch, run without pause; its timeout
    adds the run's minutes (and cooling) to ``deploy.timeout_s`` (the build's)."""
    from device.schema import JobSpec

    cfg = ctx.recipe.deploy
    precision = ladder["rungs"][rung]["precision"] if session.runtime == "tensorrt" else "fp32"
    return JobSpec(artifact=session.digest(path), runtime=session.runtime, precision=precision,
                   batch_sizes=[cfg.sustained.batch_size], warmup_iterations=cfg.warmup_iterations,
                   idle_s=cfg.idle_s, profile=False, timeout_s=cfg.timeout_s + cfg.sustained.runs_s(),
                   label=f"{ctx.recipe.name}/{rung}/sustained", sustained=cfg.sustained.job_spec())

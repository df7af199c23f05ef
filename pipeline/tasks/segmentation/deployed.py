"""Segmentation's part of the deploy stage (:mod:`pipeline.stages.deploy`): each rung's ONNX and the evaluation set
(the test canvases as network inputs), timed on the agent and then run there through the same engine with the argmax
on the device after each batch (:mod:`device.scoring.segmentation_evaluation`), the two timed apart. The build host, which
holds the true masks, computes each rung's device-measured mIoU with its interval; each rung's network p50 has an
interval over rounds and a ratio to the FP32 student's paired by round (:mod:`pipeline.deploy.records`). With
``deploy.frame``, round 1 also times a camera frame's path to its mask (the same argmax, :mod:`device.jobs.frame`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.deploy.hooks import Job, Windows
from pipeline.deploy.scored import ScoredDeploy
from pipeline.tasks.segmentation.ship import SegmentationShip


@dataclass
class Plan:
    """What every device is sent (each rung's ONNX, one evaluation set) and what its masks are scored against."""

    artifacts: dict[str, Path]
    evaluation_set: Path
    test: Any
    count: int
    ladder: dict[str, Any]
    preprocess: dict[str, Any]
    frames: Any = None  # pipeline.deploy.frames.FrameFiles with deploy.frame


def device_masks(evaluation) -> np.ndarray:
    """The masks an agent returned (N×H×W ``uint8``).

    Raises:
        ValueError: The result carries no masks, or bytes that do not hold their shape.
    """
    from device.scoring.segmentation_evaluation import unpack_masks

    if evaluation is None or evaluation.masks is None or evaluation.mask_shape is None:
        raise ValueError("the agent returned no masks: it predates result schema 2.14 (upgrade the agent to this "
                         "EdgeFold)")
    return unpack_masks(evaluation.masks, evaluation.mask_shape)


class SegmentationDeploy(ScoredDeploy):
    """Device-measured mIoU through the engine each rung was timed with, the argmax timed apart."""

    device_modules = ("device.scoring.segmentation_evaluation",)
    ship = SegmentationShip()  # its nvinfer graph ends in a Softmax: measured as a form of each rung

    def needs(self, ctx):
        return ("data", "export", "quantize", "evaluate")

    def prepare(self, ctx, workdir: Path) -> Plan:
        from pipeline.deploy.frames import frame_files, tensor_preprocess
        from pipeline.tasks.segmentation.data import load_split, network_inputs

        ladder = json.loads(ctx.manifest.output("evaluate", "ladder").read_text())
        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        count = min(ctx.recipe.deploy.evaluate_images or len(test), len(test))
        path = workdir / "evaluation-set.npy"
        np.save(path, network_inputs(test.images[:count]), allow_pickle=False)
        artifacts = {rung: ctx.run_dir / row["artifact"] for rung, row in ladder["rungs"].items()}
        # A camera frame's pixels reach the network as the canvases do: square, RGB in 0–1 (the graph normalizes).
        preprocess = tensor_preprocess(test.images.shape[1])
        return Plan(artifacts, path, test, count, ladder, preprocess,
                    frame_files(ctx, artifacts, workdir, dict.fromkeys(artifacts, preprocess), "segmentation"))

    def windows(self, ctx, session, plan: Plan) -> Windows | None:
        from device.client import AgentError
        from device.schema import EvaluationSpec, JobSpec
        from pipeline.deploy.records import scored_job

        try:  # content-addressed: uploaded once per device
            uploaded = session.client.upload(plan.evaluation_set)
        except AgentError as err:
            session.outcome.update(status="lost" if err.status == 0 else "failed", error=err.message)
            return None

        def spec(job: Job, round_index: int) -> JobSpec:
            # Round 1 also runs the set through the engine it timed, the argmax on the device.
            return scored_job(ctx, session, job, round_index, plan.ladder,
                              EvaluationSpec(artifact=uploaded, images=plan.count, top_k=1, postprocess="segmentation"),
                              plan.frames, plan.preprocess)

        return Windows([Job(rung, path) for rung, path in plan.artifacts.items()], spec,
                       lambda job, round_index: f"{job.rung} round {round_index + 1} ({session.runtime}, "
                                                f"{plan.ladder['rungs'][job.rung]['precision']})")

    def rung_record(self, ctx, rung, rounds, plan: Plan):
        return _rung_record(rounds, plan, ctx.recipe.deploy.resamples)

    def evaluation_inputs(self, manifest, artifact: Path, indices):
        """The test canvases at ``indices`` as the network takes them, as the set was sent."""
        from pipeline.tasks.segmentation.data import load_split, network_inputs

        return network_inputs(load_split(manifest.output("data", "canvases"), "test").images[list(indices)])

    def cleanup(self, plan: Plan):
        plan.evaluation_set.unlink(missing_ok=True)


def _rung_record(rounds: list[dict[str, Any]], plan: Plan, resamples: int) -> dict[str, Any]:
    """A rung's record: round 1's device mIoU (the engine's masks, argmax on the device) with its interval, and the
    timings of every round (:func:`pipeline.deploy.records.timed_record`)."""
    from pipeline.deploy.records import timed_record
    from pipeline.tasks.segmentation.metrics import score_masks

    first = rounds[0]
    if first["state"] != "succeeded":
        return {"state": first["state"], "error": first.get("error")}
    truth, classes = plan.test.masks[: plan.count], plan.ladder["classes"]
    try:
        scores = score_masks(truth, device_masks(first["result"].evaluation), classes, resamples=resamples)
        # Every other engine the job timed (TensorRT's per batch, a sweep's per accelerator): its mIoU on the same
        # images, a point figure.
        others = [{"label": scored.engine(), "miou": score_masks(truth, device_masks(scored), classes, 0)["miou"]}
                  for scored in first["result"].more_evaluations]
    except ValueError as err:
        return {"state": "failed", "error": str(err)}
    return timed_record(rounds, plan.count, scores, others)

"""Detection's part of the deploy stage (:mod:`pipeline.stages.deploy`): each rung's ONNX with its sidecar and the
evaluation set (the test canvases as network inputs), timed on the agent and then scored there through the same
engine with the device's own decode + NMS after each batch (:mod:`device.scoring.detection_evaluation`), the two
timed apart. The build host, which holds the boxes, scales the detections to the canvases and computes COCO mAP with
intervals: the rung's device-measured mAP; each rung's network p50 has an interval over rounds and a ratio to the FP32
student's paired by round (the record, the sustained run and results: :class:`pipeline.deploy.scored.ScoredDeploy`).
With ``deploy.frame``, round 1 also times a camera frame's path to its boxes (the same decode + NMS,
:mod:`device.jobs.frame`). Unlike classification, no power sweep (the recipe refuses it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.deploy.hooks import Job, Windows
from pipeline.deploy.scored import ScoredDeploy


def device_boxes(detections: list[dict], network_size: int, sizes: list[tuple[int, int]]):
    """The agent's detections (network pixels) as :class:`Boxes` in each image's own pixels."""
    import numpy as np

    from pipeline.tasks.detection.metrics import Boxes

    out = []
    for found, (height, width) in zip(detections, sizes):
        scale = np.array([width, height, width, height], np.float64) / network_size
        out.append(Boxes(np.asarray(found["boxes"], np.float64).reshape(-1, 4) * scale,
                         np.asarray(found["labels"], np.int64), np.asarray(found["scores"], np.float64)))
    return out


@dataclass
class Plan:
    """What every device is sent: each rung's ONNX and sidecar, the evaluation set of its input size and feed; and
    what its detections are scored against (the test canvases, the ladder's classes)."""

    artifacts: dict[str, Path]
    sizes: dict[str, int]
    sets: dict[str, Path]
    test: Any
    count: int
    ladder: dict[str, Any]
    preprocess: dict[str, dict[str, Any]]
    frames: Any = None  # pipeline.deploy.frames.FrameFiles with deploy.frame


class DetectionDeploy(ScoredDeploy):
    """Device-measured mAP through the engine each rung was timed with, its post-processing timed apart."""

    device_modules = ("device.scoring.detection_evaluation",)

    def needs(self, ctx):
        return ("data", "export", "quantize", "evaluate")  # the rungs and their sidecars are those stages' outputs

    def prepare(self, ctx, workdir: Path) -> Plan:
        from pipeline.deploy.frames import frame_files, tensor_preprocess
        from pipeline.tasks.detection.export import feed_of, network_inputs, sidecar_path
        from pipeline.tasks.detection.files import load_split

        ladder = json.loads(ctx.manifest.output("evaluate", "ladder").read_text())
        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        count = min(ctx.recipe.deploy.evaluate_images or len(test), len(test))
        artifacts = {rung: ctx.run_dir / row["artifact"] for rung, row in ladder["rungs"].items()}
        heads = {rung: json.loads(sidecar_path(path).read_text()) for rung, path in artifacts.items()}
        sizes = {rung: head["input_shape"][-1] for rung, head in heads.items()}
        sets = {}  # rung → its evaluation set: one file per input size and feed
        for rung, head in heads.items():
            feed = feed_of(head)
            path = workdir / f"evaluation-set-{sizes[rung]}-{feed['channel_order']}-{feed['input_range']}.npy"
            if not path.is_file():
                np.save(path, np.ascontiguousarray(network_inputs(test.images[:count], sizes[rung], **feed)),
                        allow_pickle=False)
            sets[rung] = path
        # A camera frame's pixels reach each rung as its set's did: resized, in its channel order and range.
        preprocess = {rung: tensor_preprocess(sizes[rung], **feed_of(head)) for rung, head in heads.items()}
        return Plan(artifacts, sizes, sets, test, count, ladder, preprocess,
                    frame_files(ctx, artifacts, workdir, preprocess, "detection"))

    def windows(self, ctx, session, plan: Plan) -> Windows | None:
        from device.client import AgentError
        from device.schema import EvaluationSpec, JobSpec
        from pipeline.deploy.records import scored_job
        from pipeline.tasks.detection.export import sidecar_path

        try:  # content-addressed: uploaded once per device
            uploaded = {path: session.client.upload(path) for path in set(plan.sets.values())}
            heads = {rung: session.client.upload(sidecar_path(path)) for rung, path in plan.artifacts.items()}
        except AgentError as err:
            session.outcome.update(status="lost" if err.status == 0 else "failed", error=err.message)
            return None

        def spec(job: Job, round_index: int) -> JobSpec:
            # Round 1 also scores the set through the engine it timed, with the device's decode.
            return scored_job(ctx, session, job, round_index, plan.ladder, EvaluationSpec(
                artifact=uploaded[plan.sets[job.rung]], images=plan.count, head=heads[job.rung],
                postprocess="detection"), plan.frames, plan.preprocess[job.rung])

        def announce(job: Job, round_index: int) -> str:
            # Logged as the graph's own precision: ONNX Runtime runs a Q/DQ graph in INT8 whatever the job field
            # says (the result's runtime.precision records what ran).
            return (f"{job.rung} round {round_index + 1} ({session.runtime}, "
                    f"{plan.ladder['rungs'][job.rung]['precision']})")

        return Windows([Job(rung, path) for rung, path in plan.artifacts.items()], spec, announce)

    def rung_record(self, ctx, rung, rounds, plan: Plan):
        return _rung_record(rung, rounds, plan, ctx.recipe.deploy)

    def evaluation_inputs(self, manifest, artifact: Path, indices):
        """The test canvases at ``indices`` at the rung's input size and feed (its sidecar's), as the set was sent."""
        from pipeline.tasks.detection.export import feed_of, network_inputs, sidecar_path
        from pipeline.tasks.detection.files import load_split

        head = json.loads(sidecar_path(artifact).read_text())
        test = load_split(manifest.output("data", "canvases"), "test")
        return network_inputs(test.images[list(indices)], head["input_shape"][-1], **feed_of(head))

    def cleanup(self, plan: Plan):
        for path in set(plan.sets.values()):
            path.unlink(missing_ok=True)


def _rung_record(rung: str, rounds: list[dict[str, Any]], plan: Plan, cfg) -> dict[str, Any]:
    """A rung's record: round 1's scores (device mAP through its own decode + NMS) and timings, and every round's
    network p50 with the median's interval over rounds (:func:`pipeline.deploy.records.timed_record`)."""
    from pipeline.deploy.records import timed_record
    from pipeline.tasks.detection.metrics import accumulate, evaluate, match, summary

    test, count, sizes, ladder = plan.test, plan.count, plan.sizes, plan.ladder
    first = rounds[0]
    if first["state"] != "succeeded":
        return {"state": first["state"], "error": first.get("error")}
    result = first["result"]
    if result.evaluation is None or result.evaluation.detections is None:
        return {"state": "failed", "error": "the agent returned no detections: it predates result schema 2.5 "
                                            "(upgrade the agent to this EdgeFold)"}
    image_sizes = [tuple(image.shape[:2]) for image in test.images[:count]]
    found = device_boxes([d.model_dump() for d in result.evaluation.detections], sizes[rung], image_sizes)
    scores = evaluate(test.boxes[:count], found, ladder["classes"], image_sizes, resamples=cfg.resamples)
    # Every other engine the job timed (TensorRT's per batch, a sweep's per accelerator): its mAP on the same
    # images, a point figure (the interval is the largest batch's).
    others = []
    for scored in result.more_evaluations:
        boxes = device_boxes([d.model_dump() for d in scored.detections or []], sizes[rung], image_sizes)
        point = summary(accumulate(match(test.boxes[:count], boxes, len(ladder["classes"]))))
        others.append({"label": scored.engine(), "map": point["map"]})
    return timed_record(rounds, count, scores, others)

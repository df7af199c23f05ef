"""Classification's part of the deploy stage (:mod:`pipeline.stages.deploy`): each rung's ONNX (and, with
``deploy.runtimes: [torch_tensorrt]``, its device checkpoint or program on the PyTorch road), the stratified
evaluation set each rung's engine scores on the device (top-k), camera frames, and the sustained run after the ladder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device.client import AgentError
from device.errors import ConfigError
from device.schema import EvaluationSpec
from pipeline.core.rungs import RUNGS, predictions_output
from pipeline.deploy.hooks import DeployHooks, Job, Windows
from pipeline.deploy.session import reachable_facts
from pipeline.deploy.sustained import sustained_run
from pipeline.deploy.jobs import job_spec
from pipeline.deploy.frames import FrameFiles, frame_files
from pipeline.tasks.classification.ship import ClassificationShip
from pipeline.tasks.classification.road_artifacts import RoadArtifacts, recorded_architecture
from pipeline.tasks.classification.images import data_set, image_batches, recorded_splits


def stratified_indices(labels: np.ndarray, count: int, seed: int = 0) -> np.ndarray:
    """``count`` test indices with every class in proportion to its share (each present class at least once),
    sorted; all of them when ``count`` covers the split."""
    if count >= len(labels):
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    classes, sizes = np.unique(labels, return_counts=True)
    quota = np.maximum(1, np.floor(count * sizes / sizes.sum()).astype(int))
    for index in np.argsort(-sizes):  # the remainder to the largest classes
        if quota.sum() >= count:
            break
        quota[index] += 1
    chosen = np.sort(np.concatenate([rng.choice(np.flatnonzero(labels == c), size=min(q, s), replace=False)
                                     for c, q, s in zip(classes, quota, sizes)]))
    # More classes than images asked for: every class once is more than count, and says so in the count.
    return chosen


def _rung_record(rounds: list[dict[str, Any]], outcome: dict[str, Any]) -> dict[str, Any]:
    """One rung's record on one device: its first succeeded round (power trace, profile) and every
    succeeded round's result (``rounds``, for the statistics), with what failed."""
    succeeded = [r for r in rounds if r["state"] == "succeeded"]
    if not succeeded:
        if not rounds and outcome["status"] == "lost":
            return {"state": "not measured", "error": f"device lost: {outcome['error']}"}
        failed = next((r for r in rounds if r["state"] != "succeeded"), {"state": "not measured", "error": None})
        return {key: value for key, value in failed.items() if key != "unreachable"}
    first = succeeded[0]
    return {"state": "succeeded", "job_id": first["job_id"], "spec": first["spec"], "result": first["result"],
            "rounds": [r["result"] for r in succeeded], "round_jobs": [r["job_id"] for r in succeeded],
            "round_started_at": [r.get("started_at") for r in succeeded],
            "rounds_failed": [r.get("error") for r in rounds if r["state"] != "succeeded"]}


@dataclass
class Plan:
    """What every device is sent: the ONNX road's artifacts, the PyTorch road's, the preprocessing, the evaluation
    set (with its labels and the host's predictions) and the frames."""

    artifacts: dict[str, Path]
    programs: dict[str, RoadArtifacts]
    preprocess: dict[str, Any]
    label: str
    evaluation: dict[str, Any] | None
    frames: FrameFiles | None


class ClassificationDeploy(DeployHooks):
    """Top-1 on the device through the engine it timed, frames, both roads and the sustained run."""

    ship = ClassificationShip()  # its nvinfer graph ends in a Softmax: measured as a form of each rung

    def preflight(self, ctx):
        """``deploy.torch_programs`` against an agent that does not trust programs is refused (an unreachable agent
        is left to the stage: it is reported there)."""
        if ctx.recipe.deploy.torch_programs:
            refusing = [name for name, info in reachable_facts(ctx) if not info.get("trust_programs")]
            if refusing:
                raise ConfigError(
                    f"deploy.torch_programs sends torch.export programs, and {', '.join(refusing)} does not trust "
                    "programs (its agent refuses .pt2 uploads: a program is code it would run)",
                    fix="leave deploy.torch_programs out: the device rebuilds each rung from its device checkpoint "
                        "(.device.pt) with the same results; or start that agent with --trust-programs, which lets "
                        "any holder of its token run code on the board")

    def needs(self, ctx):
        return tuple(stage for stage in ("export", "quantize") if ctx.manifest.stage(stage))

    def prepare(self, ctx, workdir: Path) -> Plan:
        cfg = ctx.recipe.deploy
        artifacts = {}
        for rung in cfg.rungs:
            stage, key = RUNGS[rung].onnx
            if ctx.manifest.stage(stage) and key in ctx.manifest.stage(stage)["outputs"]:
                artifacts[rung] = ctx.manifest.output(stage, key)
        preprocess = json.loads(ctx.manifest.output("export", "preprocess").read_text())
        evaluation = _evaluation_set(ctx, workdir, artifacts) if cfg.evaluate_images else None
        # Each rung with its preprocessing in the graph; the images the frames come from.
        frames = frame_files(ctx, artifacts, workdir, dict.fromkeys(artifacts, preprocess), "top_k",
                             (lambda: _raw_images(ctx, evaluation)) if evaluation else None)
        return Plan(artifacts, _programs(ctx), preprocess, f"{ctx.recipe.name}/{ctx.run_dir.name}", evaluation, frames)

    def windows(self, ctx, session, plan: Plan) -> Windows:
        cfg, outcome, client = ctx.recipe.deploy, session.outcome, session.client
        # The ONNX road's rungs, then the Torch-TensorRT road's where the agent has it: one set of rounds for both.
        jobs = [Job(rung, path) for rung, path in plan.artifacts.items()]
        if plan.programs:
            outcome["roads"] = {"torch_tensorrt": _torch_road(session, plan.programs, jobs)}
        scoring = None
        if plan.evaluation is not None:
            try:  # content-addressed like a model: uploaded once per device, never twice
                scoring = EvaluationSpec(artifact=client.upload(plan.evaluation["path"]),
                                         images=plan.evaluation["images"], top_k=plan.evaluation["top_k"],
                                         postprocess="top_k")
            except AgentError as err:
                outcome["evaluation_error"] = err.message

        def spec(job: Job, round_index: int):
            # Round 1 also scores the set through the engine it timed, and (ONNX road) times the frame's path.
            return job_spec(job.rung, session.digest(job.path), session.info, cfg, plan.preprocess,
                            f"{plan.label}/{job.shown}/round{round_index + 1}", profile=round_index == 0,
                            evaluation=scoring if round_index == 0 else None, sweep=cfg.sweep, road=job.road,
                            frame=(plan.frames.spec(client, job.rung) if plan.frames and round_index == 0
                                   and job.road == "tensorrt" else None))

        return Windows(jobs, spec)

    def record(self, ctx, outcome, plan: Plan, rounds):
        for job, records in rounds.items():
            if job.road == "tensorrt":
                outcome["rungs"][job.rung] = _rung_record(records, outcome)
            else:
                outcome["roads"][job.road]["rungs"][job.rung] = _rung_record(records, outcome)

    def after(self, ctx, plan: Plan, outcome, open_session):
        cfg = ctx.recipe.deploy
        if cfg.sustained is not None:  # after the ladder's windows: the board heats under it alone
            outcome["sustained"] = sustained_run(
                ctx, plan.artifacts, outcome, open_session,
                lambda session, rung, path: job_spec(rung, session.digest(path), session.info, cfg, plan.preprocess,
                                                     f"{plan.label}/{rung}/sustained", profile=False,
                                                     sustained=cfg.sustained,
                                                     sweep=cfg.sweep if cfg.sustained.swept else None))

    def evaluation_inputs(self, manifest, artifact: Path, indices):
        """The test images at ``indices``, preprocessed as the deploy stage did (every rung takes the same input)."""
        from pipeline.core.context import RunContext

        ctx = RunContext.of_run(manifest)
        wanted, seen, kept = sorted(indices), 0, {}
        for x, *_ in image_batches(ctx, "test", 256):
            for position in wanted:
                if seen <= position < seen + len(x):
                    kept[position] = x[position - seen].numpy()
            seen += len(x)
            if seen > wanted[-1]:
                break
        return np.stack([kept[i] for i in indices]).astype(np.float32)

    def results(self, ctx, plan: Plan):
        evaluation = plan.evaluation
        if evaluation is not None:  # kept off the agent: the labels and the host's predictions on the same images
            evaluation = {key: value for key, value in evaluation.items() if key != "path"}
        results = {"evaluation": evaluation, "frame": plan.frames.record("deploy") if plan.frames else None}
        if plan.programs:
            from device.files import sha256_file

            results["programs"] = {
                rung: {kind: {"path": str(path.relative_to(ctx.run_dir)), "sha256": sha256_file(path)}
                       for kind, path in (("program", art.program), ("checkpoint", art.checkpoint)) if path is not None}
                for rung, art in plan.programs.items()}
        return results

    def cleanup(self, plan: Plan):
        if plan.evaluation is not None:
            plan.evaluation["path"].unlink(missing_ok=True)


def _programs(ctx) -> dict[str, RoadArtifacts]:
    """The Torch-TensorRT road: each float rung's torch.export program and device checkpoint (an FP16 rung is its
    FP32 form's, cast on the device); the INT8 rung's device checkpoint with ModelOpt's state, exported there."""
    cfg, programs = ctx.recipe.deploy, {}
    if "torch_tensorrt" not in cfg.runtimes:
        return programs
    exported = ctx.manifest.stage("export")["outputs"]
    quantized = (ctx.manifest.stage("quantize") or {}).get("outputs", {})
    for rung in cfg.rungs:
        source = rung if RUNGS[rung].checkpoint_stage else RUNGS[rung].form_of
        if RUNGS[rung].precision == "int8":
            stage, key = "quantize", "student_int8_device_checkpoint"
            found = key in quantized
        else:
            stage, key = "export", f"{source}_device_checkpoint"
            found = key in exported
        if found:
            checkpoint = ctx.manifest.output(stage, key)
            program = (ctx.manifest.output("export", f"{source}_pt2")
                       if cfg.torch_programs and f"{source}_pt2" in exported else None)
            programs[rung] = RoadArtifacts(checkpoint, program, recorded_architecture(checkpoint))
    return programs


def _evaluation_set(ctx, workdir: Path, artifacts: dict[str, Path]) -> dict[str, Any]:
    """The evaluation set every rung's engine scores on every device: ``deploy.evaluate_images`` test
    images (stratified per class), preprocessed once with the shared preprocessing, as a float32 ``.npy``;
    with the labels and each rung's host predictions on the same images."""
    from device.files import sha256_file

    images, labels = [], []
    for x, y, *_ in image_batches(ctx, "test", 500):
        images.append(x.numpy())
        labels.append(y.numpy())
    images, labels = np.concatenate(images), np.concatenate(labels)
    chosen = stratified_indices(labels, ctx.recipe.deploy.evaluate_images)
    path = workdir / "evaluation-set.npy"
    np.save(path, np.ascontiguousarray(images[chosen], dtype=np.float32), allow_pickle=False)
    host = {}
    for rung in artifacts:
        stage, key = predictions_output(ctx.manifest, rung)
        if ctx.manifest.stage(stage) and key in ctx.manifest.stage(stage)["outputs"]:
            host[rung] = np.load(ctx.manifest.output(stage, key), allow_pickle=False)[chosen].astype(int).tolist()
    classes = len(data_set(ctx).classes)
    return {"path": path, "sha256": sha256_file(path), "images": int(len(chosen)), "top_k": min(5, classes),
            "indices": chosen.astype(int).tolist(), "labels": labels[chosen].astype(int).tolist(),
            "host_top1": host, "classes": list(data_set(ctx).classes),
            "stratified": len(chosen) < len(labels), "of_images": int(len(labels))}


def _raw_images(ctx, evaluation: dict[str, Any]) -> list[np.ndarray]:
    """The evaluation set's images as the data holds them (uint8, before any preprocessing), in its order."""
    test = data_set(ctx).test
    return [test.image(int(index)) for index in recorded_splits(ctx)["test"][np.asarray(evaluation["indices"])]]


def _torch_road(session, programs: dict[str, RoadArtifacts], jobs: list[Job]) -> dict[str, Any]:
    """The Torch-TensorRT road on one device: what each rung sends (its jobs appended to ``jobs``), or why the
    road or a rung is not measured there."""
    info = session.info
    road = {"status": "ok", "reason": None, "torch_tensorrt": info.get("torch_tensorrt"), "rungs": {}, "sent": {}}
    if not info.get("torch_tensorrt"):
        road.update(status="not measured", reason="the agent has no Torch-TensorRT (pip install "
                                                  "'edgefold[torch-tensorrt]' on the device)")
        session.log(f"Torch-TensorRT road not measured: {road['reason']}")
        return road
    for rung, artifacts_of_rung in programs.items():
        path, road["sent"][rung] = artifacts_of_rung.for_device(info)
        if path is not None:
            jobs.append(Job(rung, path, "torch_tensorrt"))
        else:
            road["rungs"][rung] = {"state": "not measured", "error": road["sent"][rung]}
            session.log(f"{rung} on the Torch-TensorRT road {road['sent'][rung]}")
    return road

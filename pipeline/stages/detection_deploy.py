"""detection deploy stage: every rung timed on each device's agent, then scored there through the engine it timed.

Each rung's ONNX goes up with its sidecar and the evaluation set (the test canvases as network inputs); the agent
times the network, then runs the set through the same runner with its own decode + NMS after each batch
(:mod:`device.detection_evaluation`), timing the two apart, and returns the detections. The build host, which holds
the boxes, scales them to the canvases and computes COCO mAP with intervals: the rung's device-measured mAP.

Unlike the classification deploy stage this one has no result cache, no interleaved rounds and no power sweep
(issue 28's benchmark needs one window per rung; those are for a later change).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pipeline.devices import Device
from pipeline.stages.base import Stage, StageResult
from pipeline.stages.detection_base import DETECTION_STAGES

LOOPBACK = Device("loopback", "edge", "", "loopback")


def device_boxes(detections: list[dict], network_size: int, sizes: list[tuple[int, int]]):
    """The agent's detections (network pixels) as :class:`Boxes` in each image's own pixels."""
    import numpy as np

    from pipeline.detection_metrics import Boxes

    out = []
    for found, (height, width) in zip(detections, sizes):
        scale = np.array([width, height, width, height], np.float64) / network_size
        out.append(Boxes(np.asarray(found["boxes"], np.float64).reshape(-1, 4) * scale,
                         np.asarray(found["labels"], np.int64), np.asarray(found["scores"], np.float64)))
    return out


class DetectionDeployStage(Stage):
    """Times every rung on each agent and scores it there (device-measured mAP, post-processing timed apart)."""

    name = "deploy"
    always_run = True  # the devices are the outside world: measured every run
    # The agent's job process and what it loads by name for a detection job (device.jobrun, device.artifacts).
    code_modules = ("device.jobrun", "device.agent", "device.detection_evaluation")

    def needs(self, ctx):
        return ("data", "export", "quantize", "evaluate")  # the rungs and their sidecars are those stages' outputs

    def config(self, ctx):
        return {"deploy": ctx.recipe.section("deploy")}

    def run(self, ctx, workdir: Path) -> StageResult:
        import numpy as np

        from pipeline.data.detection_files import load_split
        from pipeline.detection_export import network_inputs, sidecar_path

        cfg = ctx.recipe.deploy
        ladder = json.loads(ctx.manifest.output("evaluate", "ladder").read_text())
        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        count = min(cfg.evaluate_images or len(test), len(test))
        artifacts = {rung: ctx.run_dir / row["artifact"] for rung, row in ladder["rungs"].items()}
        sizes = {rung: json.loads(sidecar_path(path).read_text())["input_shape"][-1] for rung, path in artifacts.items()}
        sets = {}
        for size in sorted(set(sizes.values())):
            path = workdir / f"evaluation-set-{size}.npy"
            np.save(path, np.ascontiguousarray(network_inputs(test.images[:count], size)), allow_pickle=False)
            sets[size] = path
        devices = list(ctx.devices) or [LOOPBACK]
        loopback, tmp = None, None
        if not ctx.devices:
            from device.loopback import LoopbackAgent

            tmp = tempfile.mkdtemp(prefix="edgefold-loopback-")
            loopback = LoopbackAgent(Path(tmp) / "agent").start()
            ctx.log(f"[  deploy] no EDGE=/DC=/DEVICES= given: loopback agent at {loopback.url} (this machine)")
        try:
            outcomes = [self._device(ctx, device, loopback, artifacts, sizes, sets, test, count, ladder)
                        for device in devices]
        finally:
            if loopback is not None:
                loopback.stop()
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for path in sets.values():
                path.unlink(missing_ok=True)
        path = workdir / "results.json"
        path.write_text(json.dumps({"devices": outcomes, "images": count}, indent=1) + "\n")
        succeeded = sum(1 for d in outcomes for r in d["rungs"].values() if r["state"] == "succeeded")
        return StageResult(outputs={"results": path},
                           metrics={"devices": {d["name"]: d["status"] for d in outcomes}, "jobs_succeeded": succeeded,
                                    "jobs": len(outcomes) * len(artifacts)})

    def _device(self, ctx, device, loopback, artifacts, sizes, sets, test, count, ladder) -> dict[str, Any]:
        from device.client import AgentClient
        from device.errors import EdgeFoldError
        from device.schema import parse_result
        from pipeline.detection_export import sidecar_path
        from pipeline.detection_metrics import evaluate
        from pipeline.jobs import choose_runtime

        cfg = ctx.recipe.deploy
        url, token = (loopback.url, loopback.token) if loopback is not None else (device.url, None)
        outcome = {**device.public(), "url": "loopback" if loopback is not None else device.url, "status": "ok",
                   "error": None, "rungs": {}}
        try:
            with AgentClient(url, token or device.token(), timeout_s=60) as client:
                runtime, fallback = choose_runtime(cfg.runtime, client.device())
                outcome.update(runtime=runtime, runtime_fallback=fallback)
                uploaded_sets = {size: client.upload(path) for size, path in sets.items()}
                truth = test.boxes[:count]
                image_sizes = [tuple(image.shape[:2]) for image in test.images[:count]]
                for rung, path in artifacts.items():
                    # TensorRT builds the precision written in the graph; ONNX Runtime runs the graph as stored.
                    precision = ladder["rungs"][rung]["precision"] if runtime == "tensorrt" else "fp32"
                    spec = {"artifact": client.upload(path), "runtime": runtime, "precision": precision,
                            "batch_sizes": list(cfg.batch_sizes), "iterations": cfg.iterations,
                            "warmup_iterations": cfg.warmup_iterations, "profile": cfg.profile,
                            "label": f"{ctx.recipe.name}/{rung}",
                            "evaluation": {"artifact": uploaded_sets[sizes[rung]], "images": count,
                                           "head": client.upload(sidecar_path(path))}}
                    # Logged as the graph's own precision: ONNX Runtime runs a Q/DQ graph in INT8 whatever the job
                    # field says (the result's runtime.precision records what ran).
                    ctx.log(f"[  deploy] {device.name}: {rung} ({runtime}, {ladder['rungs'][rung]['precision']})")
                    job = client.wait(client.submit(spec)["id"], timeout_s=cfg.timeout_s)
                    if job["state"] != "succeeded":
                        outcome["rungs"][rung] = {"state": job["state"], "error": job.get("error")}
                        continue
                    result = parse_result(job["result"], f"{rung} on {device.name}")
                    if result.evaluation is None or result.evaluation.detections is None:
                        outcome["rungs"][rung] = {"state": "failed", "error": "the agent returned no detections: it "
                                                  "predates result schema 2.5 (upgrade the agent to this EdgeFold)"}
                        continue
                    found = device_boxes([d.model_dump() for d in result.evaluation.detections], sizes[rung],
                                         image_sizes)
                    scores = evaluate(truth, found, ladder["classes"], image_sizes, resamples=cfg.resamples)
                    outcome["rungs"][rung] = {
                        "state": "succeeded", "job_id": job["id"], "precision": result.runtime.precision,
                        "scores": scores,
                        "latency_p50_ms": {run.batch_size: run.latency_p50_ms for run in result.runs},
                        "network_ms_per_image": 1e3 * result.evaluation.network_s / count,
                        "postprocess_ms_per_image": 1e3 * result.evaluation.postprocess_s / count,
                        "evaluation_batch": result.evaluation.batch_size}
        except EdgeFoldError as err:  # an unreachable or failing device is recorded, as classification's deploy does
            outcome.update(status="failed", error=str(err))
        return outcome

    def summary(self, metrics):
        return f"{metrics['jobs_succeeded']}/{metrics['jobs']} jobs succeeded on " + ", ".join(
            f"{name} ({status})" for name, status in metrics["devices"].items())


DETECTION_STAGES.add(DetectionDeployStage.name, DetectionDeployStage())

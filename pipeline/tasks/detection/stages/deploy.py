"""detection deploy stage: every rung timed on each device's agent, then scored there through the engine it timed.

Each rung's ONNX goes up with its sidecar and the evaluation set (the test canvases as network inputs); the agent
times the network, then runs the set through the same runner with its own decode + NMS after each batch
(:mod:`device.detection_evaluation`), timing the two apart, and returns the detections. The build host, which holds
the boxes, scales them to the canvases and computes COCO mAP with intervals: the rung's device-measured mAP.

Every rung is timed in ``deploy.rounds`` interleaved rounds (one window per rung per round; round 1 also scores the
set and profiles), so each rung's network p50 has an interval over rounds and its ratio to the FP32 student one
paired by round; each round's result is cached by artifact, agent, its fingerprint, code (loopback) and job
(:func:`pipeline.jobs.window_key`), so a second run measures nothing again. Unlike the classification deploy stage this one has no power sweep.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.stage import Stage, StageResult
from pipeline.jobs import deploy_targets

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


class DetectionDeployStage(Stage):
    """Times every rung on each agent and scores it there (device-measured mAP, post-processing timed apart)."""

    name = "deploy"
    always_run = True  # the devices are the outside world: measured every run
    # The agent's job process and what it loads by name for a detection job (device.jobrun, device.artifacts).
    code_modules = ("device.jobrun", "device.agent", "device.detection_evaluation")

    def preflight(self, ctx):
        """``deploy.runtime: tensorrt`` against an agent without TensorRT is refused before the first stage, as
        every task's deploy does (:func:`~pipeline.deploy.session.require_runtime`)."""
        from pipeline.deploy.session import require_runtime

        require_runtime(ctx)

    def needs(self, ctx):
        return ("data", "export", "quantize", "evaluate")  # the rungs and their sidecars are those stages' outputs

    def config(self, ctx):
        return {"deploy": ctx.recipe.section("deploy")}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.export import feed_of, network_inputs, sidecar_path

        cfg = ctx.recipe.deploy
        ladder = json.loads(ctx.manifest.output("evaluate", "ladder").read_text())
        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        count = min(cfg.evaluate_images or len(test), len(test))
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
        try:
            with deploy_targets(ctx) as (devices, loopback):
                outcomes = [self._device(ctx, device, loopback, artifacts, sizes, sets, test, count, ladder)
                            for device in devices]
        finally:
            for path in set(sets.values()):
                path.unlink(missing_ok=True)
        path = workdir / "results.json"
        path.write_text(json.dumps({"devices": outcomes, "images": count}, indent=1) + "\n")
        succeeded = sum(1 for d in outcomes for r in d["rungs"].values() if r["state"] == "succeeded")
        reused = sum(r.get("reused_rounds", 0) for d in outcomes for r in d["rungs"].values())
        return StageResult(outputs={"results": path},
                           metrics={"devices": {d["name"]: d["status"] for d in outcomes}, "jobs_succeeded": succeeded,
                                    "jobs": len(outcomes) * len(artifacts), "rounds": cfg.rounds,
                                    "windows_reused": reused})

    def _device(self, ctx, device, loopback, artifacts, sizes, sets, test, count, ladder) -> dict[str, Any]:
        from device.client import AgentError
        from device.schema import EvaluationSpec, JobSpec, parse_result
        from pipeline.deploy.session import DeviceSession
        from pipeline.jobs import interleaved_rounds
        from pipeline.tasks.detection.export import sidecar_path

        cfg = ctx.recipe.deploy
        url, token = (loopback.url, loopback.token) if loopback is not None else (device.url, None)
        cache = ctx.run_dir / "deploy-cache"
        cache.mkdir(exist_ok=True)
        records: dict[str, list[dict[str, Any]]] = {rung: [] for rung in artifacts}
        with DeviceSession(device, url, token, cfg.runtime, cache, self.code_modules, ctx.log) as session:
            if session.open():
                try:  # content-addressed: uploaded once per device
                    uploaded = {path: session.client.upload(path) for path in set(sets.values())}
                    heads = {rung: session.client.upload(sidecar_path(path)) for rung, path in artifacts.items()}
                except AgentError as err:
                    session.outcome.update(status="lost" if err.status == 0 else "failed", error=err.message)
                else:
                    def window(rung: str, round_index: int) -> dict[str, Any]:
                        # TensorRT builds the precision written in the graph; ONNX Runtime runs the graph as stored.
                        precision = ladder["rungs"][rung]["precision"] if session.runtime == "tensorrt" else "fp32"
                        spec = JobSpec(
                            artifact=session.digest(artifacts[rung]), runtime=session.runtime, precision=precision,
                            batch_sizes=list(cfg.batch_sizes), iterations=cfg.iterations,
                            warmup_iterations=cfg.warmup_iterations, idle_s=cfg.idle_s,
                            profile=cfg.profile and round_index == 0, timeout_s=cfg.timeout_s,
                            label=f"{ctx.recipe.name}/{rung}/round{round_index + 1}",
                            # Round 1 also scores the set through the engine it timed, with the device's decode.
                            evaluation=EvaluationSpec(artifact=uploaded[sets[rung]], images=count,
                                                      head=heads[rung], postprocess="detection") if round_index == 0 else None)
                        # Logged as the graph's own precision: ONNX Runtime runs a Q/DQ graph in INT8 whatever the
                        # job field says (the result's runtime.precision records what ran).
                        return session.window(rung, artifacts[rung], spec, round_index, cfg.retries,
                                              cfg.timeout_s + 120, announce=f"{rung} round {round_index + 1} "
                                              f"({session.runtime}, {ladder['rungs'][rung]['precision']})")

                    interleaved_rounds(list(artifacts), cfg.rounds, window, records)
        outcome = session.outcome
        reused = outcome.pop("reused", [])
        for rung, rounds in records.items():
            if rounds:
                typed = [{**r, "result": parse_result(r["result"], f"{rung} on {device.name}")}
                         if r["state"] == "succeeded" else r for r in rounds]
                outcome["rungs"][rung] = self._rung(rung, typed, test, count, sizes, ladder, cfg)
                outcome["rungs"][rung]["reused_rounds"] = reused.count(rung)
        _ratios(outcome["rungs"])
        return outcome

    def summary(self, metrics):
        return (f"{metrics['jobs_succeeded']}/{metrics['jobs']} rungs measured in {metrics.get('rounds', 1)} "
                f"interleaved rounds ({metrics.get('windows_reused', 0)} windows reused) on "
                + ", ".join(f"{name} ({status})" for name, status in metrics["devices"].items()))

    @staticmethod
    @staticmethod
    def _rung(rung: str, rounds: list[dict[str, Any]], test, count: int, sizes, ladder, cfg) -> dict[str, Any]:
        """A rung's record: round 1's scores (device mAP through its own decode + NMS) and timings, and every round's
        network p50 with the median's interval over rounds."""
        from pipeline.results import reported_figures
        from pipeline.tasks.detection.metrics import evaluate

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
        from pipeline.tasks.detection.metrics import accumulate, match, summary

        others = []
        for scored in result.more_evaluations:
            boxes = device_boxes([d.model_dump() for d in scored.detections or []], sizes[rung], image_sizes)
            point = summary(accumulate(match(test.boxes[:count], boxes, len(ladder["classes"]))))
            others.append({"label": scored.engine(), "map": point["map"]})
        windows = {}
        for entry in rounds:
            if entry["state"] == "succeeded":
                for run in entry["result"].runs:
                    windows.setdefault(run.batch_size, []).append(run.latency_p50_ms)
        batch = min(windows)
        # The measured fields the result schema declares (latency with its interval over rounds, energy, peak
        # temperature, lowest clock …), over every succeeded round.
        figures = reported_figures(e["result"] for e in rounds if e["state"] == "succeeded")
        return {"state": "succeeded", "job_id": first["job_id"], "precision": result.runtime.precision,
                "scores": scores, "latency_p50_ms": {b: float(np.median(v)) for b, v in windows.items()},
                "latency_p50_windows_ms": {b: v for b, v in windows.items()},
                "network_p50": {"batch": batch, "median_ms": figures["latency_p50_ms"],
                                "low_ms": figures["latency_p50_low_ms"], "high_ms": figures["latency_p50_high_ms"],
                                "rounds": len(windows[batch])},
                "rounds_failed": [e.get("error") for e in rounds if e["state"] != "succeeded"],
                # Round 1's per-layer profile of the engine it timed (or why there is none), for "where the time goes".
                "profile": result.profile, "profile_note": result.runtime.profile_note,
                "runtime": result.runtime.name,
                # Each batch's engine by its key in the agent's cache (edgefold ship fetches it and its build).
                "engines": (result.runtime.built.engines or None) if result.runtime.built else None,
                "network_ms_per_image": 1e3 * result.evaluation.network_s / count,
                "postprocess_ms_per_image": 1e3 * result.evaluation.postprocess_s / count,
                "evaluation_batch": result.evaluation.batch_size, "other_engines": others,
                "evaluation_note": result.evaluation_note, "reported": figures}


REFERENCE_RUNG = "student"  # the FP32 student: what the INT8 fold is compared with


def _ratios(rungs: dict[str, dict[str, Any]]) -> None:
    """Each rung's network p50 over the FP32 student's, paired by round (a round's busy spell cancels), with its
    interval (:func:`pipeline.stats.ratio_interval`); ``vs_student`` in each measured rung's record."""
    from pipeline.stats import ratio_interval, significant

    reference = rungs.get(REFERENCE_RUNG, {})
    if reference.get("state") != "succeeded":
        return
    batch = reference["network_p50"]["batch"]
    for name, entry in rungs.items():
        windows = (entry.get("latency_p50_windows_ms") or {}).get(batch)
        if entry.get("state") != "succeeded" or name == REFERENCE_RUNG or not windows:
            continue
        ratio, low, high = ratio_interval(windows, reference["latency_p50_windows_ms"][batch])
        entry["vs_student"] = {"batch": batch, "ratio": ratio, "low": low, "high": high,
                               "significant": significant(low, high)}

"""deploy stage: every rung to every device's agent, benchmarked there.

Devices come from ``EDGE=``/``DC=``/``DEVICES=`` (see :mod:`pipeline.devices`); with none, a
loopback agent is started on this machine for the run and stopped after it. Devices run
concurrently (bounded by ``deploy.parallel_devices``); on one device the rungs run one after the
other, as the agent runs one job at a time anyway. An unreachable or failing device is recorded
with its reason and the others carry on.

A result is reused when its artifact, the device (agent URL and fingerprint) and the job spec are all
unchanged: results are kept under ``<run>/deploy-cache/`` by the hash of those, and the stage always
re-checks the fingerprints (a JetPack upgrade or a new power mode means measuring again).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from device.client import AgentError
from device.errors import ConfigError
from device.files import sha256_file
from device.schema import EvaluationSpec
from pipeline.deploy.session import DeviceSession, reachable_facts, require_runtime
from pipeline.devices import DEPLOY_SCHEMA, Device
from pipeline.jobs import LOOPBACK, deploy_targets, interleaved_rounds, job_spec
from pipeline.tasks.classification.frame_files import FrameFiles, write_frame_files
from pipeline.tasks.classification.road_artifacts import RoadArtifacts, recorded_architecture
from pipeline.core.rungs import RUNGS, predictions_output
from pipeline.core.stage import Stage, StageResult



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


class DeployStage(Stage):
    name = "deploy"
    always_run = True  # device fingerprints are re-checked every time; unchanged results are reused
    # The loopback agent runs this checkout's measurement code in its job processes.
    code_modules = ("device.jobrun", "device.agent")

    def preflight(self, ctx):
        """Refused before the first stage, with the agent's own reason and fix (an unreachable agent is left to the
        stage: it is reported there): ``deploy.runtime: tensorrt`` against an agent without TensorRT
        (:func:`~pipeline.deploy.session.require_runtime`), and ``deploy.torch_programs`` against an agent that does
        not trust programs."""
        if ctx.recipe.deploy.torch_programs:
            self._programs_trusted(ctx)
        require_runtime(ctx)

    @staticmethod
    def _programs_trusted(ctx) -> None:
        """Every configured agent accepts programs (``--trust-programs``); the loopback agent is started so."""
        refusing = [name for name, info in reachable_facts(ctx) if not info.get("trust_programs")]
        if refusing:
            raise ConfigError(f"deploy.torch_programs sends torch.export programs, and {', '.join(refusing)} "
                              "does not trust programs (its agent refuses .pt2 uploads: a program is code it would run)",
                              fix="leave deploy.torch_programs out: the device rebuilds each rung from its device "
                                  "checkpoint (.device.pt) with the same results; or start that agent with "
                                  "--trust-programs, which lets any holder of its token run code on the board")

    def needs(self, ctx):
        return tuple(stage for stage in ("export", "quantize") if ctx.manifest.stage(stage))

    def config(self, ctx):
        return {"deploy": ctx.recipe.section("deploy"), "devices": [d.public() for d in ctx.devices]}

    def run(self, ctx, workdir: Path) -> StageResult:
        cfg = ctx.recipe.deploy
        artifacts = {}
        for rung in cfg.rungs:
            stage, key = RUNGS[rung].onnx
            if ctx.manifest.stage(stage) and key in ctx.manifest.stage(stage)["outputs"]:
                artifacts[rung] = ctx.manifest.output(stage, key)
        # The Torch-TensorRT road: each float rung's torch.export program and device checkpoint (an FP16 rung is its
        # FP32 form's, cast on the device); the INT8 rung's device checkpoint with ModelOpt's state, exported there.
        programs = {}
        if "torch_tensorrt" in cfg.runtimes:
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
        preprocess = json.loads(ctx.manifest.output("export", "preprocess").read_text())
        cache = ctx.run_dir / "deploy-cache"
        cache.mkdir(exist_ok=True)
        label = f"{ctx.recipe.name}/{ctx.run_dir.name}"
        lock = threading.Lock()
        evaluation = self._evaluation_set(ctx, workdir, artifacts) if cfg.evaluate_images else None

        def log(text: str) -> None:
            with lock:
                ctx.log(f"[  deploy] {text}")

        frames = None
        if cfg.frame is not None:  # each rung with its preprocessing in the graph; the images the frames come from
            frames = write_frame_files(cfg.frame, workdir, artifacts, preprocess,
                                       (lambda: self._raw_images(ctx, evaluation)) if evaluation else None, log)
            for note in filter(None, (frames.in_graph_note, frames.images_note)):
                ctx.log(f"[  deploy] frames: {note}")
        with deploy_targets(ctx) as (targets, loopback):
            def deploy_one(device: Device) -> dict[str, Any]:
                token = loopback.token if loopback and device is LOOPBACK else None
                url = loopback.url if loopback and device is LOOPBACK else device.url
                outcome = self._device(device, url, token, artifacts, preprocess, cfg, cache, label, ctx, lock,
                                       evaluation, programs, frames)
                if cfg.sustained is not None:  # after the ladder's windows: the board heats under it alone
                    outcome["sustained"] = self._sustained(device, url, token, artifacts, preprocess, cfg, cache,
                                                           label, ctx, lock, outcome)
                return outcome

            with ThreadPoolExecutor(max_workers=min(cfg.parallel_devices, len(targets))) as pool:
                outcomes = list(pool.map(deploy_one, targets))
        reused = sum(len(d.pop("reused", [])) for d in outcomes)
        if evaluation is not None:  # kept off the agent: the labels and the host's predictions on the same images
            evaluation["path"].unlink()
            evaluation = {key: value for key, value in evaluation.items() if key != "path"}
        results = {"schema": DEPLOY_SCHEMA, "devices": outcomes, "evaluation": evaluation,
                   "frame": frames.record(self.name) if frames else None,
                   "artifacts": {rung: {"path": str(path.relative_to(ctx.run_dir)), "sha256": sha256_file(path)}
                                 for rung, path in artifacts.items()}}
        if programs:
            results["programs"] = {rung: {kind: {"path": str(path.relative_to(ctx.run_dir)), "sha256": sha256_file(path)}
                                          for kind, path in (("program", art.program), ("checkpoint", art.checkpoint))
                                          if path is not None}
                                   for rung, art in programs.items()}
        (workdir / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        measured = sum(1 for d in outcomes for r in d["rungs"].values() if r["state"] == "succeeded")
        windows = sum(len(r.get("rounds", [])) for d in outcomes for r in d["rungs"].values())
        return StageResult(outputs={"results": workdir / "results.json"},
                           metrics={"devices": {d["name"]: d["status"] for d in outcomes}, "jobs_succeeded": measured,
                                    "jobs_reused": reused, "jobs": len(outcomes) * len(artifacts),
                                    "rounds": cfg.rounds, "windows": windows})

    @staticmethod
    def _evaluation_set(ctx, workdir: Path, artifacts: dict[str, Path]) -> dict[str, Any]:
        """The evaluation set every rung's engine scores on every device: ``deploy.evaluate_images`` test
        images (stratified per class), preprocessed once with the shared preprocessing, as a float32 ``.npy``;
        with the labels and each rung's host predictions on the same images."""
        images, labels = [], []
        for x, y, *_ in ctx.batches("test", 500):
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
        classes = len(ctx.dataset().classes)
        return {"path": path, "sha256": sha256_file(path), "images": int(len(chosen)), "top_k": min(5, classes),
                "indices": chosen.astype(int).tolist(), "labels": labels[chosen].astype(int).tolist(),
                "host_top1": host, "classes": list(ctx.dataset().classes),
                "stratified": len(chosen) < len(labels), "of_images": int(len(labels))}

    @staticmethod
    def _raw_images(ctx, evaluation: dict[str, Any]) -> list[np.ndarray]:
        """The evaluation set's images as the data holds them (uint8, before any preprocessing), in its order."""
        test = ctx.dataset().test
        return [test.image(int(index)) for index in ctx.splits()["test"][np.asarray(evaluation["indices"])]]

    @staticmethod
    def _torch_road(device: Device, info: dict[str, Any], programs: dict[str, RoadArtifacts], jobs: list, ctx,
                    lock: threading.Lock) -> dict[str, Any]:
        """The Torch-TensorRT road on one device: what each rung sends (its jobs appended to ``jobs``), or why the
        road or a rung is not measured there."""
        road = {"status": "ok", "reason": None, "torch_tensorrt": info.get("torch_tensorrt"), "rungs": {}, "sent": {}}
        if not info.get("torch_tensorrt"):
            road.update(status="not measured", reason="the agent has no Torch-TensorRT (pip install "
                                                      "'edgefold[torch-tensorrt]' on the device)")
            with lock:
                ctx.log(f"[  deploy] {device.name}: Torch-TensorRT road not measured: {road['reason']}")
            return road
        for rung, artifacts_of_rung in programs.items():
            path, road["sent"][rung] = artifacts_of_rung.for_device(info)
            if path is not None:
                jobs.append((rung, "torch_tensorrt", path))
            else:
                road["rungs"][rung] = {"state": "not measured", "error": road["sent"][rung]}
                with lock:
                    ctx.log(f"[  deploy] {device.name}: {rung} on the Torch-TensorRT road {road['sent'][rung]}")
        return road

    def _device(self, device: Device, url: str, token: str | None, artifacts: dict[str, Path], preprocess, cfg,
                cache: Path, label: str, ctx, lock: threading.Lock,
                evaluation: dict[str, Any] | None = None,
                programs: dict[str, RoadArtifacts] | None = None, frames: FrameFiles | None = None) -> dict[str, Any]:
        with DeviceSession(device, url, token, cfg.runtime, cache, self.code_modules, ctx.log, lock) as session:
            if not session.open():
                return session.outcome
            outcome, info, client = session.outcome, session.info, session.client
            # The ONNX road's rungs, then the Torch-TensorRT road's where the agent has it: one set of rounds for both.
            jobs = [(rung, "tensorrt", path) for rung, path in artifacts.items()]
            if programs:
                outcome["roads"] = {"torch_tensorrt": self._torch_road(device, info, programs, jobs, ctx, lock)}
            scoring = None
            if evaluation is not None:
                try:  # content-addressed like a model: uploaded once per device, never twice
                    scoring = EvaluationSpec(artifact=client.upload(evaluation["path"]), images=evaluation["images"],
                                             top_k=evaluation["top_k"], postprocess="top_k")
                except AgentError as err:
                    outcome["evaluation_error"] = err.message

            def window(job: tuple[str, str, Path], round_index: int) -> dict[str, Any]:
                rung, road_name, path = job
                shown = rung if road_name == "tensorrt" else f"{rung}@{road_name}"
                # Round 1 also scores the set through the engine it timed, and (ONNX road) times the frame's path.
                spec = job_spec(rung, session.digest(path), info, cfg, preprocess,
                                f"{label}/{shown}/round{round_index + 1}", profile=round_index == 0,
                                evaluation=scoring if round_index == 0 else None, sweep=cfg.sweep, road=road_name,
                                frame=(frames.spec(client, rung) if frames and round_index == 0
                                       and road_name == "tensorrt" else None))
                return session.window(shown, path, spec, round_index, cfg.retries,
                                      (spec.timeout_s or cfg.job_timeout_s) + 120)

            # Interleaved rounds: teacher, pruned, student, INT8, teacher, … one window each per round, so a
            # busy spell hits every rung of its round and cancels in their paired ratios (pipeline.stats).
            rounds: dict[tuple[str, str, Path], list[dict[str, Any]]] = {job: [] for job in jobs}
            interleaved_rounds(jobs, cfg.rounds, window, rounds)
            for (rung, road_name, _), records in rounds.items():
                if road_name == "tensorrt":
                    outcome["rungs"][rung] = _rung_record(records, outcome)
                else:
                    outcome["roads"][road_name]["rungs"][rung] = _rung_record(records, outcome)
        return outcome

    def _sustained(self, device: Device, url: str, token: str | None, artifacts: dict[str, Path], preprocess, cfg,
                   cache: Path, label: str, ctx, lock: threading.Lock, outcome: dict[str, Any]) -> dict[str, Any]:
        """``deploy.sustained``: its rung run without pause on this device (:mod:`device.sustain`), once; reused,
        like a window, while its artifact, the device and the job are unchanged."""
        rung, path = cfg.sustained.rung, artifacts.get(cfg.sustained.rung)
        if outcome["status"] != "ok" or path is None:
            return {"rung": rung, "state": "not measured",
                    "error": outcome.get("error") or f"{rung} has no ONNX artifact in this run"}
        with DeviceSession(device, url, token, cfg.runtime, cache, self.code_modules, ctx.log, lock) as session:
            if not session.open(say_fallback=False):  # said by the ladder's session already
                return {"rung": rung, "state": "not measured", "error": session.outcome["error"]}
            spec = job_spec(rung, session.digest(path), session.info, cfg, preprocess, f"{label}/{rung}/sustained",
                            profile=False, sustained=cfg.sustained, sweep=cfg.sweep if cfg.sustained.swept else None)
            # Never retried: a retry would run the board for the minutes again (a failure is reported as it is).
            record = session.window(f"{rung} sustained", path, spec, 0, 0, (spec.timeout_s or cfg.job_timeout_s) + 120,
                                    announce=f"{rung} run without pause for {cfg.sustained.minutes:g} min"
                                             + (" under each sweep setting" if spec.sweep is not None else ""))
        return {"rung": rung, **{k: v for k, v in record.items() if k != "unreachable"}}

    def summary(self, metrics):
        devices = ", ".join(f"{name} {status}" for name, status in metrics["devices"].items())
        return (f"{metrics['jobs_succeeded']}/{metrics['jobs']} rungs measured in {metrics.get('rounds', 1)} interleaved "
                f"rounds ({metrics['jobs_reused']} windows reused); {devices}")

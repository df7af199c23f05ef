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
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from device.client import AgentClient, AgentError, JobTimeoutError
from device.errors import ConfigError, EdgeFoldError
from device.files import write_json_atomic
from device.schema import JobSpec, PreprocessSpec, describe_problems, field_problems, parse_result, safe_text
from pipeline.codehash import code_sha256
from pipeline.devices import DEPLOY_SCHEMA, Device
from pipeline.manifest import sha256_file, sha256_json
from pipeline.rungs import RUNGS
from pipeline.stages.base import STAGES, Stage, StageResult

# What makes two measurements comparable: a change in any of these measures again.
FINGERPRINT_KEYS = ("hostname", "machine", "board", "l4t", "jetpack", "gpu", "compute_capability", "cuda", "tensorrt",
                    "onnxruntime", "torch", "nvpmodel", "jetson_clocks", "edgefold")
LOOPBACK = Device("loopback", "edge", "", "loopback")


def job_spec(rung: str, artifact: str, device_info: dict[str, Any], cfg, preprocess: dict[str, Any],
             label: str, profile: bool = True) -> JobSpec:
    """The benchmark job for one rung on one device, as the agent's own schema (validated here)."""
    runtime = cfg.runtime
    trt_major = int(str(device_info.get("tensorrt") or "0").split(".")[0] or 0)
    if runtime == "auto":  # the engine builder needs TensorRT 10 or newer (JetPack 6.1+)
        runtime = "tensorrt" if trt_major >= 10 else "onnxruntime"
    precision = RUNGS[rung].precision
    if runtime == "tensorrt" and precision == "fp32" and trt_major < 11:
        # TensorRT 10 builds float rungs in FP16 (as trtexec --fp16); 11 is strongly typed: the model's own type.
        precision = "fp16"
    try:
        return JobSpec(artifact=artifact, runtime=runtime, precision=precision, batch_sizes=list(cfg.batch_sizes),
                       duration_s=cfg.duration_s, warmup_iterations=cfg.warmup_iterations, idle_s=cfg.idle_s,
                       min_iterations=cfg.min_iterations, profile=profile,
                       sample_hz=cfg.sample_hz, threads=cfg.threads, telemetry="auto", timeout_s=cfg.job_timeout_s,
                       preprocess=PreprocessSpec(**preprocess), label=safe_text(label, 200))
    except ValidationError as err:  # the recipe was validated with the same bounds: this is a bug, said plainly
        raise ConfigError(f"deploy: the job for {rung} does not fit the agent's schema: "
                          f"{describe_problems(field_problems(err.errors()))}",
                          fix="check the recipe's deploy section and the export stage's preprocess.json") from None


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


def _reusable(path: Path) -> bool:
    """Whether a cached measurement still reads as this version's result."""
    try:
        parse_result(json.loads(path.read_text()).get("result"), str(path))
    except (EdgeFoldError, ValueError, AttributeError):
        return False
    return True


class DeployStage(Stage):
    name = "deploy"
    always_run = True  # device fingerprints are re-checked every time; unchanged results are reused
    # The loopback agent runs this checkout's measurement code in its job processes.
    code_modules = ("device.jobrun", "device.agent")

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
        preprocess = json.loads(ctx.manifest.output("export", "preprocess").read_text())
        cache = ctx.run_dir / "deploy-cache"
        cache.mkdir(exist_ok=True)
        devices = list(ctx.devices)
        loopback, tmp = None, None
        if not devices:
            from device.loopback import LoopbackAgent

            tmp = tempfile.mkdtemp(prefix="edgefold-loopback-")
            try:
                loopback = LoopbackAgent(Path(tmp) / "agent").start()
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            ctx.log(f"[  deploy] no EDGE=/DC=/DEVICES= given: loopback agent at {loopback.url} (this machine)")
        label = f"{ctx.recipe.name}/{ctx.run_dir.name}"
        lock = threading.Lock()

        def deploy_one(device: Device) -> dict[str, Any]:
            token = loopback.token if loopback and device is LOOPBACK else None
            url = loopback.url if loopback and device is LOOPBACK else device.url
            return self._device(device, url, token, artifacts, preprocess, cfg, cache, label, ctx, lock)

        targets = devices or [LOOPBACK]
        try:
            with ThreadPoolExecutor(max_workers=min(cfg.parallel_devices, len(targets))) as pool:
                outcomes = list(pool.map(deploy_one, targets))
        finally:
            if loopback is not None:
                loopback.stop()
            if tmp is not None:  # the agent's copies of every uploaded model (6–100 MB each)
                shutil.rmtree(tmp, ignore_errors=True)
        reused = sum(len(d.pop("reused", [])) for d in outcomes)
        results = {"schema": DEPLOY_SCHEMA, "devices": outcomes,
                   "artifacts": {rung: {"path": str(path.relative_to(ctx.run_dir)), "sha256": sha256_file(path)}
                                 for rung, path in artifacts.items()}}
        (workdir / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        measured = sum(1 for d in outcomes for r in d["rungs"].values() if r["state"] == "succeeded")
        windows = sum(len(r.get("rounds", [])) for d in outcomes for r in d["rungs"].values())
        return StageResult(outputs={"results": workdir / "results.json"},
                           metrics={"devices": {d["name"]: d["status"] for d in outcomes}, "jobs_succeeded": measured,
                                    "jobs_reused": reused, "jobs": len(outcomes) * len(artifacts),
                                    "rounds": cfg.rounds, "windows": windows})

    def _device(self, device: Device, url: str, token: str | None, artifacts: dict[str, Path], preprocess, cfg,
                cache: Path, label: str, ctx, lock: threading.Lock) -> dict[str, Any]:
        outcome: dict[str, Any] = {**device.public(), "url": url if device is not LOOPBACK else "loopback",
                                   "status": "ok", "error": None, "fingerprint": None, "info": None, "rungs": {}}
        try:
            client = AgentClient(url, token or device.token(), timeout_s=60)
        except EdgeFoldError as err:
            return {**outcome, "status": "unreachable", "error": str(err)}
        with client:
            try:
                info = client.device()
            except AgentError as err:
                return {**outcome, "status": "unreachable", "error": err.message}
            fingerprint = {key: info.get(key) for key in FINGERPRINT_KEYS}
            outcome.update(info=info, fingerprint=fingerprint)
            # Interleaved rounds: teacher, pruned, student, INT8, teacher, … one window each per round, so a
            # busy spell hits every rung of its round and cancels in their paired ratios (pipeline.stats).
            code = code_sha256(self.code_modules)[0] if device is LOOPBACK else None
            digests = {rung: sha256_file(path) for rung, path in artifacts.items()}
            rounds: dict[str, list[dict[str, Any]]] = {rung: [] for rung in artifacts}
            for round_index in range(cfg.rounds):
                for rung, path in artifacts.items():
                    if outcome["status"] == "lost":
                        break
                    spec = job_spec(rung, digests[rung], info, cfg, preprocess,
                                    f"{label}/{rung}/round{round_index + 1}", profile=round_index == 0)
                    # The agent itself is part of the key: two boards of one kind are each measured (a fleet);
                    # its name in the report is only a label. A loopback agent measures with this checkout's
                    # code: editing device/measure.py measures again.
                    key = sha256_json({"artifact": digests[rung], "agent": device.url, "code": code,
                                       "fingerprint": fingerprint, "round": round_index,
                                       "spec": spec.model_dump(mode="json", exclude={"label"}, exclude_none=True)})
                    cached = cache / f"{key}.json"
                    if cached.is_file() and not _reusable(cached):
                        cached.unlink()  # written by another EdgeFold version: measured again
                    if cached.is_file():
                        # Not flagged in the record: results.json stays byte-identical, so the report is cached.
                        record = json.loads(cached.read_text())
                        outcome.setdefault("reused", []).append(rung)
                        with lock:
                            ctx.log(f"[  deploy] {device.name}: {rung} round {round_index + 1} reused "
                                    "(same artifact, device and job)")
                    else:
                        record = self._benchmark(client, device, rung, path, spec, cfg, ctx, lock)
                        if record["state"] == "succeeded":
                            write_json_atomic(cached, record, sort_keys=True)
                        elif record.get("unreachable"):
                            outcome.update(status="lost", error=record["error"])
                    rounds[rung].append(record)
            for rung in artifacts:
                outcome["rungs"][rung] = _rung_record(rounds[rung], outcome)
        return outcome

        return outcome

    @staticmethod
    def _benchmark(client: AgentClient, device: Device, rung: str, path: Path, spec: JobSpec, cfg, ctx,
                   lock: threading.Lock) -> dict[str, Any]:
        def report(job: dict[str, Any]) -> None:
            with lock:
                ctx.log(f"[  deploy] {device.name}: {rung} {job['state']}"
                        f"{' — ' + job['progress'] if job.get('progress') and job['state'] == 'running' else ''}")

        last_error = None
        for attempt in range(cfg.retries + 1):
            try:
                client.upload(path)
                submitted = client.submit(spec)
                job = client.wait(submitted["id"], timeout_s=cfg.job_timeout_s + 120, on_progress=report)
            except JobTimeoutError as err:
                # The agent answers: this rung failed, the device is not lost. Cancelled, or it holds the queue;
                # not retried, a second attempt would wait as long.
                return {"state": "failed", "error": f"{err.message}; {client.abandon(err.job_id)}",
                        "spec": spec.model_dump(mode="json", exclude_none=True)}
            except AgentError as err:
                if err.status == 0:  # connection lost: the device is gone for this run
                    return {"state": "failed", "error": err.message, "unreachable": True}
                last_error = err.message
                continue
            if job["state"] == "succeeded":
                try:  # the agent's result, typed: an agent of another version is named, not misread
                    result = parse_result(job["result"], f"{device.name}'s result for {rung}")
                except EdgeFoldError as err:
                    return {"state": "failed", "error": f"{err.message} ({err.fix})",
                            "spec": spec.model_dump(mode="json", exclude_none=True)}
                return {"state": "succeeded", "job_id": job["id"], "spec": spec.model_dump(mode="json", exclude_none=True),
                        "result": result.dump(), "attempts": attempt + 1, "started_at": job.get("started_at")}
            last_error = job["error"]
            if job["state"] not in ("failed", "interrupted"):
                break
        return {"state": "failed", "error": last_error, "spec": spec.model_dump(mode="json", exclude_none=True)}

    def summary(self, metrics):
        devices = ", ".join(f"{name} {status}" for name, status in metrics["devices"].items())
        return (f"{metrics['jobs_succeeded']}/{metrics['jobs']} rungs measured in {metrics.get('rounds', 1)} interleaved "
                f"rounds ({metrics['jobs_reused']} windows reused); {devices}")


STAGES.add("deploy", DeployStage())

"""deploy stage, the same for every task: every rung to every device's agent, measured there in interleaved rounds.

Devices come from ``EDGE=``/``DC=``/``DEVICES=`` (see :mod:`pipeline.deploy.devices`); with none, a loopback agent is
started on this machine for the run and stopped after it. Devices run concurrently (bounded by
``deploy.parallel_devices``); on one device the windows run one after the other, as the agent runs one job at a time
anyway. An unreachable or failing device is recorded with its reason and the others carry on.

A window is reused while its artifact, the device (agent URL and fingerprint), the measuring code and the job are
unchanged (:class:`pipeline.deploy.session.DeviceSession`); the stage always re-checks the fingerprints (a JetPack
upgrade or a new power mode means measuring again). The task says what it sends and how it reads the results
(:class:`pipeline.deploy.hooks.DeployHooks`).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from device.errors import StageError
from pipeline.core.stage import HookedStage, StageResult
from pipeline.deploy.hooks import DeployHooks, Job
from pipeline.deploy.session import DeviceSession, require_runtime
from pipeline.deploy.devices import DEPLOY_SCHEMA, Device
from pipeline.deploy.jobs import LOOPBACK, deploy_targets, interleaved_rounds
from pipeline.deploy.nvinfer_form import ROAD as FORM_ROAD, Form, form_records, with_forms, write_forms

# The agent's job process and what it runs for every task (a loopback agent runs this checkout's).
AGENT_MODULES = ("device.jobs.jobrun", "device.service.agent")


class DeployStage(HookedStage):
    """Every rung timed (and scored, where the task sends an evaluation set) on each device.

    Args:
        hooks: The task's part (:class:`~pipeline.deploy.hooks.DeployHooks`).
    """

    name = "deploy"
    always_run = True  # device fingerprints are re-checked every time; unchanged results are reused
    hooks: DeployHooks

    def __init__(self, hooks: DeployHooks):
        super().__init__(hooks)
        self.device_modules = AGENT_MODULES + tuple(hooks.device_modules)
        self.code_modules = self.code_modules + self.device_modules

    def preflight(self, ctx):
        """``deploy.runtime: tensorrt`` against an agent without TensorRT is refused before the first stage
        (:func:`~pipeline.deploy.session.require_runtime`), and what the task's jobs cannot get from the agents."""
        self.hooks.preflight(ctx)
        require_runtime(ctx)

    def needs(self, ctx):
        return self.hooks.needs(ctx)

    def config(self, ctx):
        return {"deploy": ctx.recipe.section("deploy"), "devices": [d.public() for d in ctx.devices]}

    def run(self, ctx, workdir: Path) -> StageResult:
        from device.files import sha256_file

        cfg = ctx.recipe.deploy
        cache = ctx.run_dir / "deploy-cache"
        cache.mkdir(exist_ok=True)
        lock = threading.Lock()
        plan = self.hooks.prepare(ctx, workdir)
        forms = (write_forms(self.hooks.ship, ctx.run_dir, plan.artifacts, workdir, ctx.log)
                 if getattr(cfg, "nvinfer", False) else {})
        try:
            with deploy_targets(ctx) as (targets, loopback):
                def deploy_one(device: Device) -> dict[str, Any]:
                    token = loopback.token if loopback and device is LOOPBACK else None
                    url = loopback.url if loopback and device is LOOPBACK else device.url
                    return self._device(ctx, device, url, token, plan, cache, lock, forms)

                with ThreadPoolExecutor(max_workers=min(cfg.parallel_devices, len(targets))) as pool:
                    outcomes = list(pool.map(deploy_one, targets))
            extra = self.hooks.results(ctx, plan)
        finally:
            self.hooks.cleanup(plan)
        # The ladder's windows and the nvinfer forms' apart: a form is a second look at its rung, not a rung.
        reused_names = [name for d in outcomes for name in d.pop("reused", [])]
        forms_reused = sum(name.endswith(f"@{FORM_ROAD}") for name in reused_names)
        windows = sum(d.pop("windows") for d in outcomes)
        results = {"schema": DEPLOY_SCHEMA, "devices": outcomes, **extra,
                   "artifacts": {rung: {"path": str(path.relative_to(ctx.run_dir)), "sha256": sha256_file(path)}
                                 for rung, path in plan.artifacts.items()}}
        (workdir / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        measured = sum(1 for d in outcomes for r in d["rungs"].values() if r["state"] == "succeeded")
        return StageResult(outputs={"results": workdir / "results.json"},
                           metrics={"devices": {d["name"]: d["status"] for d in outcomes}, "jobs_succeeded": measured,
                                    "jobs_reused": len(reused_names) - forms_reused,
                                    **({"nvinfer_forms": len(forms), "nvinfer_windows_reused": forms_reused}
                                       if forms else {}),
                                    "jobs": len(outcomes) * len(plan.artifacts),
                                    "rounds": cfg.rounds, "windows": windows})

    def _device(self, ctx, device: Device, url: str, token: str | None, plan, cache: Path,
                lock: threading.Lock, forms: dict[str, Form] | None = None) -> dict[str, Any]:
        """One device: its session, the task's jobs (and each rung's nvinfer form after it) in interleaved rounds,
        each rung's record, then what the task measures after the ladder."""
        cfg = ctx.recipe.deploy

        def open_session() -> DeviceSession:
            return DeviceSession(device, url, token, cfg.runtime, cache, self.device_modules, ctx.log, lock)

        rounds: dict[Job, list[dict[str, Any]]] = {}
        with open_session() as session:
            windows = self.hooks.windows(ctx, session, plan) if session.open() else None
            if windows is not None:
                windows = with_forms(windows, forms or {})
                def window(job: Job, round_index: int) -> dict[str, Any]:
                    spec = windows.spec(job, round_index)
                    if spec.timeout_s is None:  # the wait is the agent's limit and two minutes: the task must say it
                        raise StageError(f"deploy: the {job.shown} job names no timeout_s",
                                         fix="this is a bug in the task's deploy hooks (every job sets it): report it")
                    return session.window(job.shown, job.path, spec, round_index, cfg.retries, spec.timeout_s + 120,
                                          announce=windows.announce(job, round_index))

                # Interleaved: teacher, pruned, student, INT8, teacher, … one window each per round (each rung's
                # nvinfer form right after it), so a busy spell hits every rung of its round and cancels in their
                # paired ratios (pipeline.stats).
                rounds = {job: [] for job in windows.jobs}
                interleaved_rounds(windows.jobs, cfg.rounds, window, rounds)
        outcome = session.outcome
        self.hooks.record(ctx, outcome, plan, {job: r for job, r in rounds.items() if job.road != FORM_ROAD})
        if forms and rounds:
            outcome["nvinfer"] = form_records(forms, rounds)
        # The ladder's windows on the ONNX road (a second road's are its own record).
        outcome["windows"] = sum(r["state"] == "succeeded" for job, records in rounds.items() if job.road == "tensorrt"
                                 for r in records)
        self.hooks.after(ctx, plan, outcome, open_session)
        return outcome

    def summary(self, metrics):
        devices = ", ".join(f"{name} {status}" for name, status in metrics["devices"].items())
        return (f"{metrics['jobs_succeeded']}/{metrics['jobs']} rungs measured in {metrics.get('rounds', 1)} "
                f"interleaved rounds ({metrics['jobs_reused']} windows reused); {devices}")

"""One device's measuring session, written once for every task's deploy stage.

The agent is opened and its facts read (an agent that does not answer is the outcome's ``unreachable``), the runtime
chosen with the reason said where ``auto`` could not pick TensorRT, and each window measured (submitted, waited for
with progress, retried, cancelled when late, its result typed) or reused from the deploy cache while its artifact,
the agent, its fingerprint, the measuring code and the job are unchanged. A window whose device was lost marks the
outcome ``lost``; the rounds stop there and what was measured is kept (:func:`pipeline.deploy.jobs.interleaved_rounds`).

A task builds its jobs (what a window of its rungs is) and reads their results; it never opens an agent itself.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from device.client import AgentClient
from device.errors import ConfigError, EdgeFoldError
from device.files import sha256_file
from device.schema import JobSpec, parse_result
from pipeline.core.codehash import code_sha256
from pipeline.deploy.devices import Device
from pipeline.deploy.jobs import (LOOPBACK, choose_runtime, fingerprint, reuse_or_measure, submit_and_wait, trt_major,
                           window_key)


class DeviceSession:
    """One device, opened for one deploy stage (a context manager: the connection is closed however it ends).

    Args:
        device: The device measured.
        url: Its agent (the loopback agent's own URL for :data:`pipeline.deploy.jobs.LOOPBACK`).
        token: The loopback agent's token; a named device reads its own (``device.token()``).
        requested_runtime: ``deploy.runtime``.
        cache: The run's deploy cache folder.
        code_modules: What the agent's job process runs; a loopback agent runs this checkout's, so an edit to them
            measures again.
        log: The stage's log (one line per call).
        lock: Held while logging (the stage's, where devices are measured concurrently).

    Attributes:
        outcome: The device's record as every task's results hold it: ``name``, ``url``, ``status`` (``ok``,
            ``unreachable``, ``lost``), ``error``, ``info``, ``fingerprint``, ``runtime``, ``runtime_fallback`` and
            the task's ``rungs``; ``reused`` lists the windows taken from the cache (popped by the stage).
    """

    def __init__(self, device: Device, url: str, token: str | None, requested_runtime: str, cache: Path,
                 code_modules: tuple[str, ...], log: Callable[[str], None], lock: threading.Lock | None = None):
        self.device, self.cache, self._log = device, cache, log
        self._url, self._token, self._requested = url, token, requested_runtime
        self._lock = lock or threading.Lock()
        self.code = code_sha256(code_modules)[0] if device is LOOPBACK else None
        self.client: AgentClient | None = None
        self.info: dict[str, Any] = {}
        self.runtime: str | None = None
        self.outcome: dict[str, Any] = {**device.public(), "url": url if device is not LOOPBACK else "loopback",
                                        "status": "ok", "error": None, "fingerprint": None, "info": None, "rungs": {}}
        self._digests: dict[Path, str] = {}

    def __enter__(self) -> "DeviceSession":
        return self

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()

    @property
    def ok(self) -> bool:
        return self.outcome["status"] == "ok"

    def log(self, text: str) -> None:
        with self._lock:
            self._log(f"[  deploy] {self.device.name}: {text}")

    def open(self, say_fallback: bool = True) -> bool:
        """Connects and reads the device's facts; False, with the outcome ``unreachable`` and why, when the agent
        does not answer. ``say_fallback``: log why ``auto`` did not pick TensorRT (once per device and stage)."""
        try:
            self.client = AgentClient(self._url, self._token or self.device.token(), timeout_s=60)
            self.info = self.client.device()
        except EdgeFoldError as err:
            self.outcome.update(status="unreachable", error=getattr(err, "message", None) or str(err))
            return False
        self.runtime, fallback = choose_runtime(self._requested, self.info)
        self.outcome.update(info=self.info, fingerprint=fingerprint(self.info), runtime=self.runtime,
                            runtime_fallback=fallback)
        if fallback and say_fallback:
            self.log(fallback)
        return True

    def digest(self, path: Path) -> str:
        """The artifact's sha256 (read once per session)."""
        if path not in self._digests:
            self._digests[path] = sha256_file(path)
        return self._digests[path]

    def window(self, shown: str, path: Path, spec: JobSpec, round_index: int, retries: int,
               wait_s: float, announce: str | None = None) -> dict[str, Any]:
        """One window of ``path``: the deploy cache's record while nothing that decides it changed, else measured.

        Args:
            shown: The window's name in the log and the outcome (``student``, ``student@torch_tensorrt``).
            spec: The job (its ``label`` is not part of the key).
            round_index: Its round (0-based), part of the key.
            retries: Resubmissions after a failed or interrupted attempt.
            wait_s: How long the job is waited for before it is cancelled and its window recorded failed.
            announce: Logged when the window is measured, not reused.

        Returns:
            ``{"state", "spec", "result" (the agent's result, typed and dumped), "job_id", …}``, or a failed record;
            ``unreachable`` where the device was lost (the outcome then says ``lost``).
        """
        # The agent is in the key (each board of a fleet is measured); loopback measures with this checkout.
        key = window_key(artifact=self.digest(path), agent=self.device.url, code=self.code,
                         fingerprint=self.outcome["fingerprint"], round_index=round_index,
                         spec=spec.model_dump(mode="json", exclude={"label"}, exclude_none=True))
        record, reused = reuse_or_measure(self.cache / f"{key}.json",
                                          lambda: self._measure(shown, path, spec, retries, wait_s, announce))
        if reused and spec.sustained is not None:
            self.log(f"{shown} run reused (same artifact, device and job)")
        elif reused:  # not flagged in the record: results.json stays byte-identical, so the report is cached
            self.outcome.setdefault("reused", []).append(shown)
            self.log(f"{shown} round {round_index + 1} reused (same artifact, device and job)")
        elif record.get("unreachable"):
            self.outcome.update(status="lost", error=record["error"])
        return record

    def _measure(self, shown: str, path: Path, spec: JobSpec, retries: int, wait_s: float,
                 announce: str | None) -> dict[str, Any]:
        if announce:
            self.log(announce)

        def report(job: dict[str, Any]) -> None:
            self.log(f"{shown} {job['state']}"
                     f"{' — ' + job['progress'] if job.get('progress') and job['state'] == 'running' else ''}")

        record = submit_and_wait(self.client, path, spec, wait_s, retries, on_progress=report)
        if record.get("unreachable"):
            return record
        record["spec"] = spec.model_dump(mode="json", exclude_none=True)
        if record["state"] == "succeeded":
            try:  # the agent's result, typed: an agent of another version is named, not misread
                record["result"] = parse_result(record["result"], f"{self.device.name}'s result for {shown}").dump()
            except EdgeFoldError as err:
                return {"state": "failed", "error": f"{err.message} ({err.fix})", "spec": record["spec"]}
        return record


def reachable_facts(ctx) -> list[tuple[str, dict[str, Any]]]:
    """(name (url), ``GET /v1/device``) of each configured agent that answers; an unreachable one is left to the stage,
    which reports it."""
    facts = []
    for device in ctx.devices:
        try:
            with AgentClient(device.url, device.token(), timeout_s=10) as client:
                facts.append((f"{device.name} ({device.url})", client.device()))
        except EdgeFoldError:
            continue
    return facts


def require_runtime(ctx) -> None:
    """Every deploy stage's preflight: ``deploy.runtime: tensorrt`` is refused before the first stage, with each
    agent's own reason and fix, where an agent has no TensorRT 10+ (the loopback agent: this machine).

    Raises:
        ConfigError: Naming each agent without TensorRT and why.
    """
    if ctx.recipe.deploy.runtime != "tensorrt":
        return
    if not ctx.devices:
        from device.info import tensorrt_status

        targets = [("the loopback agent (this machine)", tensorrt_status())]
    else:
        targets = [(name, info.get("tensorrt_status") or {
            "found": trt_major(info) >= 10, "reason": f"its agent reports TensorRT {info.get('tensorrt')}",
            "fix": "upgrade the agent to this EdgeFold's version"}) for name, info in reachable_facts(ctx)]
    missing = [(name, status) for name, status in targets if not status.get("found")]
    if missing:
        named = "; ".join(f"{name}: {status.get('reason')}" for name, status in missing)
        fixes = "; ".join(dict.fromkeys(status.get("fix") or "install TensorRT" for _, status in missing))
        raise ConfigError(f"deploy.runtime is tensorrt but TensorRT is not available on {named}",
                          fix=f"{fixes}; or run with --set deploy.runtime=auto (ONNX Runtime where TensorRT "
                              "is missing, said so in the report)")

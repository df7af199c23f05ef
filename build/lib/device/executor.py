"""Runs the agent's queued jobs one at a time, each in a child process with a timeout.

Measurements need the device to themselves, so there is one executor thread and one child at a
time. The child (``python -m device.jobrun``) gets its own session so a timeout or a cancel kills
it and anything it started. Its exit is read from the files it wrote and its exit status: a
signal (SIGSEGV, SIGKILL from the OOM killer) or a timeout fails that job with the reason and
the tail of its log; the executor moves on to the next job.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from device.store import Store

log = logging.getLogger("edgefold.agent")
LOG_TAIL_LINES = 15


def describe_exit(returncode: int) -> str:
    """'exit status 1' or 'killed by SIGSEGV' (with the usual cause of that signal)."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = {"SIGKILL": " (out of memory? the kernel's OOM killer sends SIGKILL)",
            "SIGSEGV": " (the runtime crashed)", "SIGABRT": " (the runtime aborted)"}.get(name, "")
    return f"killed by {name}{hint}"


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def pid_is_job(pid: int) -> bool:
    """Whether ``pid`` is still one of our job children (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"device.jobrun" in cmdline


class Executor:
    """The single job thread.

    Args:
        store: Jobs and artifacts.
        job_timeout_s: Default wall-clock limit of a job (load, engine build and measurement).
        jtop_socket: Where the jtop service listens (passed to the children).
        env: Extra environment for the children.
    """

    def __init__(self, store: Store, job_timeout_s: float = 1800.0, jtop_socket: str | None = "/run/jtop.sock",
                 env: dict[str, str] | None = None):
        self.store, self.job_timeout_s, self.jtop_socket = store, job_timeout_s, jtop_socket
        self.env = env or {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._child: subprocess.Popen | None = None
        self._child_job: str | None = None
        self._cancel = threading.Event()
        self.finished_total: dict[str, int] = {}

    # ----------------------------------------------------------------- lifecycle
    def recover(self) -> list[str]:
        """After a restart: running jobs become interrupted (their orphaned children killed)."""
        interrupted = []
        for job_id, pid in self.store.running_pids():
            if pid and pid_is_job(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self.store.finish(job_id, "interrupted", error="the agent stopped while this job ran (restart or crash); "
                                                           "submit it again")
            interrupted.append(job_id)
        if interrupted:
            log.warning("marked %d job(s) interrupted after a restart: %s", len(interrupted), ", ".join(interrupted))
        return interrupted

    def start(self) -> None:
        self.recover()
        self._thread = threading.Thread(target=self._loop, name="edgefold-executor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops taking jobs; a running one is killed and marked interrupted (queued ones stay queued)."""
        self._stopping.set()
        self._wake.set()
        self._kill_child()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, job_id: str) -> bool:
        """Cancels a queued or running job; False when it had already finished."""
        if self._child_job == job_id:
            self._cancel.set()
            self._kill_child()
        return self.store.finish(job_id, "cancelled", error="cancelled by a client")

    def _kill_child(self) -> None:
        child = self._child
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    @property
    def running_job(self) -> str | None:
        return self._child_job

    # ----------------------------------------------------------------- the loop
    def _loop(self) -> None:
        while not self._stopping.is_set():
            job = self.store.claim_next()
            if job is None:
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            try:
                state, result, error = self._run(job)
            except Exception as err:  # the executor must outlive anything one job does
                log.exception("job %s", job.id)
                state, result, error = "failed", None, f"agent error while running the job: {err}"
            if self._stopping.is_set() and state != "succeeded":
                state, error = "interrupted", "the agent was stopped while this job ran; submit it again"
            if self.store.finish(job.id, state, result=result, error=error):
                self.finished_total[state] = self.finished_total.get(state, 0) + 1
                log.info("job %s %s%s", job.id, state, f": {error.splitlines()[0]}" if error else "")

    def _run(self, job) -> tuple[str, dict[str, Any] | None, str | None]:
        found = self.store.get_artifact(job.spec.artifact)
        if found is None:
            return "failed", None, f"artifact {job.spec.artifact} is no longer stored; upload it again"
        _, artifact_path = found
        job_dir = self.store.job_dir(job.id)
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / "job.json").write_text(json.dumps({
            "spec": job.spec.model_dump(), "artifact_path": str(artifact_path),
            "engine_cache": str(self.store.root / "engines"), "jtop_socket": self.jtop_socket}))
        timeout_s = job.spec.timeout_s or self.job_timeout_s
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                          env.get("PYTHONPATH")]))
        self._cancel.clear()
        with open(job_dir / "log.txt", "ab") as log_file:
            child = subprocess.Popen([sys.executable, "-m", "device.jobrun", str(job_dir)], stdout=log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=job_dir)
        self._child, self._child_job = child, job.id
        self.store.set_pid(job.id, child.pid)
        deadline = time.monotonic() + timeout_s
        last_progress = None
        try:
            while child.poll() is None:
                if time.monotonic() > deadline:
                    self._kill_child()
                    child.wait()
                    return "failed", None, (f"timed out after {timeout_s:g} s (hung, or too slow for the job's "
                                            f"timeout_s); log tail:\n{_tail(job_dir / 'log.txt')}")
                progress = self._progress(job_dir)
                if progress and progress != last_progress:
                    self.store.set_progress(job.id, progress)
                    last_progress = progress
                time.sleep(0.1)
        finally:
            self._child, self._child_job = None, None
        if self._cancel.is_set():
            return "cancelled", None, "cancelled by a client"
        if child.returncode == 0 and (job_dir / "result.json").is_file():
            return "succeeded", json.loads((job_dir / "result.json").read_text()), None
        if (job_dir / "error.json").is_file():
            error = json.loads((job_dir / "error.json").read_text())
            fix = f"\n  fix: {error['fix']}" if error.get("fix") else ""
            return "failed", None, f"{error['type']}: {error['message']}{fix}"
        return "failed", None, f"the job process died: {describe_exit(child.returncode)}; log tail:\n" \
                               f"{_tail(job_dir / 'log.txt')}"

    @staticmethod
    def _progress(job_dir: Path) -> str | None:
        try:
            return json.loads((job_dir / "progress.json").read_text())["progress"]
        except (OSError, ValueError, KeyError):
            return None

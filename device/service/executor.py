"""Runs the agent's queued jobs one at a time, each in a child process with a timeout.

Measurements need the device to themselves, so there is one executor thread and one child at a
time. The child (``device.jobs.jobrun``, forked from a warm parent: :mod:`device.service.launcher`) gets its own session so a timeout or a cancel kills
it and anything it started. Its exit is read from the files it wrote and its exit status: a
signal (SIGSEGV, SIGKILL from the OOM killer) or a timeout fails that job with the reason and
the tail of its log; the executor moves on to the next job. Nothing raised while claiming,
starting or finishing a job stops the executor: the job fails with the reason, and an executor
thread that is not alive shows in ``/v1/health``.

Power modes: a sweep job's process records the device's mode in a hold file (:mod:`device.power.power_modes`)
before changing it, and removes it once it has put the mode back. A hold still there when the job ends
(cancelled, timed out, crashed), or found at start-up (the agent was killed), is restored here, in a
process of its own; while it cannot be, every job is refused with the reason, since a job would
measure, or a sweep record as original, a mode nobody chose. Jobs run one at a time, so a sweep never
starts while another job runs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from device.errors import ResultError
from device.files import sweep_temporaries
from device.service.launcher import JobProcess, Launcher
from device.power.power_modes import DEFAULT_CONF, HOLD_FILE, DeviceHeldError, PowerModeError, read_hold
from device.schema import parse_result
from device.service.store import Store

log = logging.getLogger("edgefold.agent")
LOG_TAIL_LINES = 15
RETRY_S = 1.0  # back-off after the database or file system failed between jobs
RESTORE_TIMEOUT_S = 120.0  # one restore: connecting to jtop, the mode, jetson_clocks, the caps showing


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


def pid_is_job(pid: int, job_dir: Path) -> bool:
    """Whether ``pid`` is still the child that ran the job in ``job_dir`` (not a recycled pid).

    A fresh child has the job dir on its command line; a child forked by the zygote has the zygote's
    (``device.service.zygote``) and the job dir as its working directory. The job dir lies under this
    agent's data dir, so two agents on one host never take each other's children for their own.
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if b"device.jobs.jobrun" not in cmdline and b"device.service.zygote" not in cmdline:
        return False
    if os.fsencode(str(job_dir)) in cmdline:
        return True
    try:
        return os.readlink(f"/proc/{pid}/cwd") == str(job_dir)
    except OSError:
        return False


def _ended(job_dir: Path) -> tuple[str, dict[str, Any] | None, str | None] | None:
    """How a job ended by the files its child left: ("succeeded", result, None), ("failed", None, reason), or
    None when they say nothing (no file, or a result this agent's schema refuses).

    Both files are written atomically and only at the child's end, so a present one is the whole story.
    """
    try:
        result = json.loads((job_dir / "result.json").read_text())
        parse_result(result, str(job_dir / "result.json"))
        return "succeeded", result, None
    except (OSError, ValueError, ResultError) as err:
        if not isinstance(err, FileNotFoundError):
            log.warning("%s: %s", job_dir / "result.json", err)
    error = _error_text(job_dir)
    return ("failed", None, error) if error is not None else None


def _error_text(job_dir: Path) -> str | None:
    """The job's ``error.json`` as one reason with its fix; None when there is none or it is unreadable."""
    try:
        error = json.loads((job_dir / "error.json").read_text())
        fix = f"\n  fix: {error['fix']}" if error.get("fix") else ""
        return f"{error.get('type', 'Error')}: {error.get('message', '')}{fix}"
    except (OSError, ValueError, AttributeError):
        return None


class _CannotStart(Exception):
    """A job that cannot start (its artifact is gone); the message is the job's error."""


class Executor:
    """The single job thread.

    Claiming a job, starting its child and recording that child happen under one lock, the lock
    :meth:`cancel` takes: a cancel either finds the job still queued (it then never starts) or finds
    its child (and kills it). The loop outlives anything a job, the database or the file system
    raises: the job at hand fails with the reason and the next one runs.

    Args:
        store: Jobs and artifacts.
        job_timeout_s: Default wall-clock limit of a job (load, engine build and measurement).
        jtop_socket: Where the jtop service listens (passed to the children).
        env: Extra environment for the children.
        nvpmodel_conf: The board's nvpmodel configuration (a sweep checks each mode's caps against it).
        use_zygote: Fork each job from a warm parent (:mod:`device.service.launcher`); False starts each one fresh.
        thermal: The thermal zones' folder and the margin below a critical trip point a sustained job stops at.
        trust_programs: The agent's ``--trust-programs``, handed to each job (its runners load a ``.pt2`` only then).
    """

    def __init__(self, store: Store, job_timeout_s: float = 1800.0, jtop_socket: str | None = "/run/jtop.sock",
                 env: dict[str, str] | None = None, nvpmodel_conf: str | None = DEFAULT_CONF,
                 use_zygote: bool = True, thermal: tuple[str, float] = ("/sys/devices/virtual/thermal", 5.0),
                 trust_programs: bool = False):
        self.store, self.job_timeout_s, self.jtop_socket = store, job_timeout_s, jtop_socket
        self.env = env or {}
        self.nvpmodel_conf = nvpmodel_conf
        self.thermal_dir, self.thermal_margin_c = thermal
        self.trust_programs = trust_programs
        self.hold_path = store.root / HOLD_FILE
        self._restore_error: str | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # claim + start + record the child, versus cancel and stop
        self._child: JobProcess | None = None
        self._launcher = Launcher(self._child_env(), store.jobs_dir, use_zygote=use_zygote)
        self._child_job: str | None = None
        self._cancelled: str | None = None
        # Ends the store could not record (database locked, disk full): retried before the next claim.
        self._unrecorded: list[tuple[str, str, dict[str, Any] | None, str | None]] = []

    @property
    def finished_total(self) -> dict[str, int]:
        """Terminal transitions since the agent started, by state, whoever made them (see Store.finish)."""
        return self.store.finished_total

    @property
    def alive(self) -> bool:
        """Whether the job thread is running (the health endpoint reports the agent unhealthy when not)."""
        return self._thread is not None and self._thread.is_alive()

    # ----------------------------------------------------------------- lifecycle
    def recover(self) -> list[str]:
        """After a restart: running jobs end as their files say, else interrupted (orphaned children killed).

        A job whose child wrote a valid ``result.json`` (or an ``error.json``) before the agent died
        ended, though the database never heard of it (the end was still in ``_unrecorded``, or the
        agent died between the child's exit and the update): it is recorded as succeeded with that
        result (or as failed), not thrown away as interrupted.

        Returns:
            The jobs marked interrupted.
        """
        interrupted, recovered = [], []
        for job_id, pid in self.store.running_pids():
            job_dir = self.store.job_dir(job_id)
            if pid and pid_is_job(pid, job_dir):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            sweep_temporaries(job_dir)
            ended = _ended(job_dir)
            if ended is not None:
                state, result, error = ended
                self.store.finish(job_id, state, result=result, error=error)
                recovered.append(f"{job_id} ({state})")
                continue
            self.store.finish(job_id, "interrupted", error="the agent stopped while this job ran (restart or crash); "
                                                           "submit it again")
            interrupted.append(job_id)
        if recovered:
            log.warning("recorded %d job(s) that ended while the agent was down, from their files: %s",
                        len(recovered), ", ".join(recovered))
        if interrupted:
            log.warning("marked %d job(s) interrupted after a restart: %s", len(interrupted), ", ".join(interrupted))
        # After the orphaned children are dead: none of them can change the mode again behind the restore.
        self.restore_power_mode()
        return interrupted

    def start(self) -> None:
        self.recover()
        self._launcher.start()
        self._thread = threading.Thread(target=self._loop, name="edgefold-executor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops taking jobs; a running one is killed and marked interrupted (queued ones stay queued)."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            self._kill_child()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._launcher.close()

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, job_id: str) -> bool:
        """Cancels a queued or running job; False when it had already finished.

        Under the executor's lock, so it cannot fall between the claim and the child's start.
        """
        with self._lock:
            if self._child_job == job_id:
                self._cancelled = job_id
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
            try:
                busy = self._step()
            except Exception:  # the database or the disk failed between jobs: back off, never die
                log.exception("executor: could not take the next job; retrying in %g s", RETRY_S)
                self._stopping.wait(RETRY_S)
                continue
            if not busy:
                self._wake.wait(timeout=1.0)
                self._wake.clear()

    def _step(self) -> bool:
        """Runs the next queued job to its end; False when the queue was empty."""
        self._record_pending()
        # A hold a restore left behind is tried again whenever a job waits (outside the lock: a restore can
        # take a minute, and a cancel must not wait for it); idle, the agent leaves the device alone.
        if self.hold_path.exists() and self.store.counts().get("queued", 0):
            self.restore_power_mode()
        with self._lock:
            if self._stopping.is_set():
                return True
            job = self.store.claim_next()
            if job is None:
                return False
            try:
                child, job_dir, timeout_s = self._start(job)
            except Exception as err:
                self._release_child()  # started but not recorded (set_pid failed): it must not run on
                if not isinstance(err, _CannotStart):
                    log.exception("job %s: could not start", job.id)
                reason = str(err) if isinstance(err, _CannotStart) else \
                    f"the agent could not start the job: {type(err).__name__}: {err}"
                self._record(job.id, "failed", None, reason)
                return True
        try:
            state, result, error = self._watch(job, child, job_dir, timeout_s)
        except Exception as err:  # the executor must outlive anything one job does
            log.exception("job %s", job.id)
            state, result, error = "failed", None, f"agent error while running the job: {type(err).__name__}: {err}"
        with self._lock:
            cancelled = self._cancelled == job.id
            self._release_child()
        sweep_temporaries(job_dir)  # however the job ended, its child is gone: what it left half-written goes
        if self.hold_path.exists():  # a sweep that did not restore (cancelled, timed out, died, restore failed)
            self.restore_power_mode()
        if cancelled:
            state, result, error = "cancelled", None, "cancelled by a client"
        elif self._stopping.is_set() and state != "succeeded":
            state, error = "interrupted", "the agent was stopped while this job ran; submit it again"
        self._record(job.id, state, result, error)
        return True

    def _release_child(self) -> None:
        """Kills and reaps the current child if it still runs, and forgets it (caller holds the lock)."""
        child = self._child
        if child is not None:
            self._kill_child()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:  # unkillable (D state): leave it to the kernel, log it
                log.error("job child %d did not exit after SIGKILL", child.pid)
        self._child, self._child_job, self._cancelled = None, None, None

    def _record(self, job_id: str, state: str, result: dict[str, Any] | None, error: str | None) -> None:
        try:
            finished = self.store.finish(job_id, state, result=result, error=error)
        except Exception:
            log.exception("job %s: could not record its end (%s); retrying before the next job", job_id, state)
            self._unrecorded.append((job_id, state, result, error))
            return
        if finished:
            log.info("job %s %s%s", job_id, state, f": {error.splitlines()[0]}" if error else "")

    def _record_pending(self) -> None:
        pending, self._unrecorded = self._unrecorded, []
        for job_id, state, result, error in pending:
            self._record(job_id, state, result, error)

    def restore_power_mode(self) -> bool:
        """Restores the mode a sweep's hold recorded, in a child process; True when nothing is held afterwards.

        Never raises: a restore that fails is logged and remembered (:meth:`_held`), and tried again.
        """
        if not self.hold_path.exists():
            self._restore_error = None
            return True
        command = [sys.executable, "-m", "device.service.hold", "restore", "--hold", str(self.hold_path),
                   "--timeout-s", str(RESTORE_TIMEOUT_S / 2)]
        command += ["--jtop-socket", self.jtop_socket] if self.jtop_socket else []
        command += ["--conf", self.nvpmodel_conf] if self.nvpmodel_conf else []
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=RESTORE_TIMEOUT_S,
                                  env=self._child_env(), start_new_session=True)
            ok, said = done.returncode == 0, (done.stdout if done.returncode == 0 else done.stderr).strip()
        except (OSError, subprocess.SubprocessError) as err:
            ok, said = False, f"the restore process failed: {type(err).__name__}: {err}"
        if ok and not self.hold_path.exists():
            log.warning("power mode: %s", said)
            self._restore_error = None
            return True
        # One line for the refusal it goes into: the reason and its fix, as the restore process printed them.
        self._restore_error = " ".join(line.strip() for line in said.splitlines()) or "the restore process said nothing"
        log.error("power mode not restored: %s", said)
        return False

    def _held(self, job) -> str | None:
        """Why ``job`` cannot run while a hold remains; None when none does."""
        try:
            held = read_hold(self.hold_path)
        except PowerModeError as err:
            return f"the device's power mode is unknown: {err}"
        if held is None:
            return None
        holder, original = held
        return str(DeviceHeldError(
            f"the device is held in a power mode set by sweep job {holder}: its original mode {original.describe()} "
            f"could not be restored ({self._restore_error or 'not tried yet'}), so job {job.id} would measure a mode "
            "nobody chose",
            fix=f"{'start the jtop service (sudo systemctl restart jtop.service) and ' if hasattr(original, 'nvpmodel_id') else ''}"
                f"submit the job again: the agent restores the original first; or set it by hand ({original.by_hand()}), delete "
                f"{self.hold_path} and submit again"))

    def _child_env(self) -> dict[str, str]:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                          env.get("PYTHONPATH")]))
        return env

    def _stored(self, sha256: str | None, kind: str, what: str) -> str | None:
        """The stored file a job names, or None where it names none."""
        if sha256 is None:
            return None
        found = self.store.get_artifact(sha256)
        if found is None or found[0].kind != kind:
            raise _CannotStart(f"{what} {sha256} is not stored as one ({kind}); upload it again")
        return str(found[1])

    def _start(self, job) -> tuple[JobProcess, Path, float]:
        """Writes the job's files and starts its child, recorded as this executor's (caller holds the lock)."""
        held = self._held(job)
        if held is not None:
            raise _CannotStart(held)
        found = self.store.get_artifact(job.spec.artifact)
        if found is None:
            raise _CannotStart(f"artifact {job.spec.artifact} is no longer stored; upload it again")
        _, artifact_path = found
        spec = job.spec
        evaluation_path = self._stored(spec.evaluation and spec.evaluation.artifact, "eval-set", "evaluation set")
        head_path = self._stored(spec.evaluation and spec.evaluation.head, "detection-head", "detection sidecar")
        frame_model_path = self._stored(spec.frame and spec.frame.in_graph, "onnx", "in-graph frame model")
        frame_images_path = self._stored(spec.frame and spec.frame.images and spec.frame.images.artifact, "image-set",
                                         "frame image set")
        job_dir = self.store.job_dir(job.id)
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / "job.json").write_text(json.dumps({
            "spec": job.spec.model_dump(), "artifact_path": str(artifact_path), "evaluation_path": evaluation_path,
            "head_path": head_path, "frame_model_path": frame_model_path, "frame_images_path": frame_images_path,
            "engine_cache": str(self.store.root / "engines"), "jtop_socket": self.jtop_socket, "job_id": job.id,
            "hold_path": str(self.hold_path), "nvpmodel_conf": self.nvpmodel_conf, "thermal_dir": self.thermal_dir,
            "thermal_margin_c": self.thermal_margin_c, "timeout_s": job.spec.timeout_s or self.job_timeout_s,
            "trust_programs": self.trust_programs,
            # The timeout's start, for a sustained run to end before it (CLOCK_MONOTONIC is one clock for every
            # process on Linux; a board's wall clock jumps when NTP first syncs).
            "launched_monotonic": time.monotonic()}))
        timeout_s = job.spec.timeout_s or self.job_timeout_s
        child = self._launcher.launch(job_dir, job_dir / "log.txt")
        self._child, self._child_job, self._cancelled = child, job.id, None
        self.store.set_pid(job.id, child.pid)
        return child, job_dir, timeout_s

    def _watch(self, job, child: JobProcess, job_dir: Path,
               timeout_s: float) -> tuple[str, dict[str, Any] | None, str | None]:
        """Waits for the child (progress relayed, timeout enforced) and reads how it ended."""
        deadline = time.monotonic() + timeout_s
        last_progress = None
        while child.poll() is None:
            if self._stopping.is_set():
                with self._lock:
                    self._kill_child()
            if time.monotonic() > deadline:
                with self._lock:
                    self._kill_child()
                child.wait()
                return "failed", None, (f"timed out after {timeout_s:g} s (hung, or too slow for the job's "
                                        f"timeout_s); log tail:\n{_tail(job_dir / 'log.txt')}")
            progress = self._progress(job_dir)
            if progress and progress != last_progress:
                try:
                    self.store.set_progress(job.id, progress)
                    last_progress = progress
                except sqlite3.Error as err:  # progress is advisory: a busy database must not fail the job
                    log.debug("job %s: progress not recorded: %s", job.id, err)
            time.sleep(0.1)
        if child.returncode == 0 and (job_dir / "result.json").is_file():
            try:
                return "succeeded", json.loads((job_dir / "result.json").read_text()), None
            except ValueError as err:
                return "failed", None, f"the job wrote an unreadable result.json ({err})"
        error = _error_text(job_dir)
        if error is not None:
            return "failed", None, error
        return "failed", None, f"the job process died: {describe_exit(child.returncode)}; log tail:\n" \
                               f"{_tail(job_dir / 'log.txt')}"

    @staticmethod
    def _progress(job_dir: Path) -> str | None:
        try:
            return str(json.loads((job_dir / "progress.json").read_text())["progress"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

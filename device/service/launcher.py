"""Starts each job's process, forked from a warm parent that has already imported what every job imports.

A job's process was a fresh ``python -m device.jobs.jobrun JOB_DIR``, and each paid again for importing NumPy,
pydantic and the result schema: 0.3-0.6 s of CPU per job on two x86 cores (a third of a short job; more on
a Jetson's cores). The zygote, ``python -m device.service.zygote`` (:mod:`device.service.zygote`), imports ``device.jobs.jobrun`` once (only what
a job imports anyway, so a job's resident memory is what it was) and forks one child per job. The child is as
isolated as a fresh process was: its own session (a timeout or a cancel kills its whole group), its own log on
its stdout and stderr, its working directory the job's, and its exit status, which the zygote reaps and reports.

When the zygote cannot serve (it never became ready, or died), jobs start as fresh processes, as before, and
the zygote is started again for the next one. If the zygote dies while a child of it runs, that child's exit
status can no longer be read: the child is killed and its job fails as killed.

The protocol is one JSON object per line: the launcher writes ``{"job_dir": ...}`` to the zygote's stdin;
the zygote answers ``{"ready": true}`` once, then ``{"job_dir": ..., "pid": N}`` per fork and
``{"pid": N, "code": C}`` when that child exits (C as :attr:`subprocess.Popen.returncode`: negative for a
signal).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Union

log = logging.getLogger("edgefold.agent")
READY_TIMEOUT_S = 15.0  # the zygote's imports; a fresh process after that
FORK_TIMEOUT_S = 10.0


class ForkedJob:
    """A job process forked by the zygote, with what the executor uses of :class:`subprocess.Popen`."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def ended(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"job process {self.pid}", timeout)
        return self.returncode


JobProcess = Union[ForkedJob, subprocess.Popen]


class _Zygote:
    """One zygote process and what its reader thread learns from it: readiness, each fork's pid, each exit.

    Everything is per zygote: a zygote that died late must not answer a fork of its successor, nor end its
    successor's children.
    """

    def __init__(self, env: dict[str, str], cwd: Path):
        self.process = subprocess.Popen([sys.executable, "-m", "device.service.zygote"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd,
                                        start_new_session=True)
        self.ready = threading.Event()
        self.replies: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.children: dict[int, ForkedJob] = {}
        self.early: dict[int, int] = {}  # exits read before their fork's reply was taken
        threading.Thread(target=self._read, name="edgefold-zygote", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, job_dir: Path) -> ForkedJob | None:
        if not self.ready.wait(READY_TIMEOUT_S):  # still importing: as long as a fresh process would take
            log.warning("job zygote not ready after %g s: this job starts as a fresh process", READY_TIMEOUT_S)
            return None
        try:
            self.process.stdin.write((json.dumps({"job_dir": str(job_dir)}) + "\n").encode())
            self.process.stdin.flush()
            pid = self.replies.get(timeout=FORK_TIMEOUT_S)
        except (OSError, ValueError, queue.Empty) as err:
            log.warning("job zygote did not fork (%s): this job starts as a fresh process", err or "no answer")
            self.kill()
            return None
        if pid is None:  # it ended while forking
            return None
        child = ForkedJob(pid)
        with self.lock:
            if pid in self.early:
                child.ended(self.early.pop(pid))
            else:
                self.children[pid] = child
        return child

    def kill(self) -> None:
        try:
            self.process.kill()
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
            self.process.wait()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("ready"):
                self.ready.set()
            elif "code" in message:
                with self.lock:
                    child = self.children.pop(message["pid"], None)
                    if child is None:
                        self.early[message["pid"]] = message["code"]
                if child is not None:
                    child.ended(message["code"])
            elif "pid" in message:
                self.replies.put(message["pid"])
        self.replies.put(None)
        self._orphaned()

    def _orphaned(self) -> None:
        """This zygote is gone: its running children's exits can no longer be read, so they are ended here."""
        with self.lock:
            children, self.children = self.children, {}
        for child in children.values():
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            child.ended(-signal.SIGKILL)
        if children:
            log.error("the job zygote died with %d job(s) running; they were killed", len(children))


class Launcher:
    """Starts job processes from the zygote (started here), or fresh when it cannot.

    Args:
        env: The job processes' environment (the zygote's, inherited by every child).
        cwd: The zygote's working directory (each child moves to its job's).
        use_zygote: False starts every job as a fresh process.
    """

    def __init__(self, env: dict[str, str], cwd: Path, use_zygote: bool = True):
        self.env, self.cwd, self.use_zygote = env, cwd, use_zygote
        self._zygote: _Zygote | None = None

    def start(self) -> None:
        """Starts the zygote in the background (it imports while the agent starts serving)."""
        if not self.use_zygote or (self._zygote is not None and self._zygote.alive):
            return
        try:
            self._zygote = _Zygote(self.env, self.cwd)
        except OSError as err:
            log.warning("job zygote not started (%s): jobs start as fresh processes", err)

    def launch(self, job_dir: Path, log_path: Path) -> JobProcess:
        """Starts the job in ``job_dir`` (its stdout and stderr appended to ``log_path``)."""
        zygote = self._zygote
        if self.use_zygote and (zygote is None or not zygote.alive):
            self.start()  # for the next job; this one starts fresh
        elif zygote is not None:
            forked = zygote.fork(job_dir)
            if forked is not None:
                return forked
        with open(log_path, "ab") as log_file:
            return subprocess.Popen([sys.executable, "-m", "device.jobs.jobrun", str(job_dir)], stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True, env=self.env, cwd=job_dir)

    def close(self) -> None:
        """Stops the zygote (a running child of it is the executor's to kill first)."""
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()

"""Starts each job's process, forked from a warm parent that has already imported what every job imports.

A job's process was a fresh ``python -m device.jobrun JOB_DIR``, and each paid again for importing NumPy,
pydantic and the result schema: 0.3-0.6 s of CPU per job on two x86 cores (a third of a short job; more on
a Jetson's cores). The zygote, ``python -m device.jobrun --zygote``, imports ``device.jobrun`` once (only what
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
import select
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
        self.process = subprocess.Popen([sys.executable, "-m", "device.jobrun", "--zygote"], stdin=subprocess.PIPE,
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
            return subprocess.Popen([sys.executable, "-m", "device.jobrun", str(job_dir)], stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True, env=self.env, cwd=job_dir)

    def close(self) -> None:
        """Stops the zygote (a running child of it is the executor's to kill first)."""
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()


def zygote_main() -> int:
    """The zygote: imports what every job imports, then forks a child per job dir read from stdin.

    Single-threaded (a fork copies only the forking thread), so no lock can be held in a child. Ends at the end
    of its stdin (the agent stopped or died); children still running go on, as a fresh job process would.
    """
    import random

    import numpy as np

    from device import jobrun

    out = sys.stdout.buffer

    def say(**message) -> None:
        out.write((json.dumps(message) + "\n").encode())
        out.flush()

    say(ready=True)
    stdin = sys.stdin.buffer.raw
    pending = b""
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.05)
        while True:  # reap every child that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            say(pid=pid, code=os.waitstatus_to_exitcode(status))
        if not readable:
            continue
        chunk = os.read(stdin.fileno(), 65536)
        if not chunk:
            return 0
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            job_dir = json.loads(line)["job_dir"]
            # The pid is told only once the child leads its own session: a cancel right after the fork kills its
            # process group, which does not exist before the child's setsid (Popen's start_new_session waits too).
            session_r, session_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(session_r)
                _child(job_dir, jobrun, random, np, session_w)
            os.close(session_w)
            os.read(session_r, 1)  # a byte after its setsid, or end of file if it died first
            os.close(session_r)
            say(job_dir=job_dir, pid=pid)


def _child(job_dir: str, jobrun, random, np, session_w: int) -> None:
    """In the forked child: a job process as ``python -m device.jobrun JOB_DIR`` would be; never returns."""
    code = 1
    try:
        os.setsid()
        os.write(session_w, b"s")
        os.close(session_w)
        os.chdir(job_dir)
        log_fd = os.open(os.path.join(job_dir, "log.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        random.seed()  # the zygote's random state is every child's otherwise
        np.random.seed()
        code = jobrun.main([job_dir])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 (what an uncaught exception does to a fresh process: printed, status 1)
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

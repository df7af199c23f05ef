"""The agent's warm parent of job processes: ``python -m device.service.zygote`` imports what every job imports once, then
forks a child per job (:mod:`device.service.launcher` starts it and speaks its protocol). Its own module, so that neither
the launcher nor the job imports the other.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys


def zygote_main() -> int:
    """The zygote: imports what every job imports, then forks a child per job dir read from stdin.

    Single-threaded (a fork copies only the forking thread), so no lock can be held in a child. Ends at the end
    of its stdin (the agent stopped or died); children still running go on, as a fresh job process would.
    """
    import random

    import numpy as np

    from device.jobs import jobrun

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
    """In the forked child: a job process as ``python -m device.jobs.jobrun JOB_DIR`` would be; never returns."""
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


if __name__ == "__main__":
    sys.exit(zygote_main())

"""Starting a jtop client: the versions of the client and the service it talks to, and a start-up error that says
which of the two things went wrong (no service, or a service of another release).

jtop refuses a client whose major.minor differs from the service's (jetson-stats 7.2.2, ``jtop/jtop.py`` start():
"Mismatch version jtop service: [S] and client: [C]", ``core/common.py`` compare_versions). A 4.2.x service uses
the same socket and sends its version in the same init message, so a board whose service is of another release
fails there, and that failure must not read as a stopped service.
"""

from __future__ import annotations

import re
import threading
import time
from importlib import metadata
from typing import Any

from device.errors import DeviceError, MissingDependencyError, require

SERVICE_FIX = "sudo systemctl restart jtop.service; in Docker mount -v /run/jtop.sock:/run/jtop.sock"
VERSION_FIX = ("make them one release: sudo pip3 install -U jetson-stats && sudo systemctl restart jtop; the agent "
               "uses the system's jtop client, so a venv with its own copy should drop it (.venv/bin/pip uninstall "
               "jetson-stats)")
_MISMATCH = re.compile(r"Mismatch version jtop service: \[(?P<service>[^\]]*)\] and client: \[(?P<client>[^\]]*)\]")


class JtopVersionError(DeviceError):
    """jtop's client and service differ in major.minor, so the service refuses the client."""

    def __init__(self, message: str, fix: str | None = VERSION_FIX, service: str | None = None,
                 client: str | None = None):
        super().__init__(message, fix)
        self.service, self.client = service, client

    def __reduce__(self):
        return (self.__class__, (self.message, self.fix, self.service, self.client))


def use_socket(socket: str | None) -> None:
    """Points this process's jtop clients at ``socket`` (jtop reads the path from a module global)."""
    if not socket:
        return
    try:
        import jtop.service

        jtop.service.JTOP_PIPE = socket
    except ImportError:
        pass  # opening a client says jetson-stats is missing, with the fix


def client_version() -> str | None:
    """The installed jetson-stats (the client this process would import), read without importing jtop."""
    try:
        return metadata.version("jetson-stats")
    except metadata.PackageNotFoundError:
        return None


def start_error(err: Exception) -> DeviceError:
    """The error for a jtop client whose ``start()`` raised ``err``.

    A version mismatch is raised as :class:`JtopVersionError`, which a job fails with; anything else as
    :class:`MissingDependencyError`, which ``telemetry: auto`` turns into a note.
    """
    found = _MISMATCH.search(str(err))
    if found:
        return JtopVersionError(
            f"the jtop service runs jetson-stats {found['service']} and this client is {found['client']}: jtop "
            "refuses a client whose major.minor differs from the service's, so there is no board power, no energy "
            "and no power-mode control", service=found["service"], client=found["client"])
    return MissingDependencyError(f"the jtop service is not reachable: {err}", fix=SERVICE_FIX)


# How long a new client waits for the service's first value (jtop's own wait: three client intervals).
FIRST_VALUE_S = 5.0
# The whole start, bounded: jtop's connect answers the manager's challenge with a blocking read, and its
# _get_configuration calls the queue's get(interval * TIMEOUT_GAIN), whose first parameter is ``block``, not a timeout
# (jetson-stats 7.2.2, jtop.py), so a service whose control loop died holds start() for ever.
START_S = 15.0
# jtop's constructor starts a thread that runs nvcc --version, opencv_version, dpkg -l and vulkaninfo
# (jtop.py __init__, core/jetson_libraries.py); a client waits for it before it is used, so that no idle or timed
# window shares the CPU with it.
LIBRARY_SCAN_S = 30.0


def start(interval_s: float, observer=None) -> Any:
    """A started jtop client whose ``service_version`` is what the service sent in its init message.

    Args:
        interval_s: The client's interval.
        observer: Attached before the client's reader starts (it iterates its observers without a lock).

    Returns only after jtop's library scan (a thread its constructor starts) has ended, or :data:`LIBRARY_SCAN_S`.

    Raises:
        MissingDependencyError: jetson-stats is not installed, or the service does not answer (within
            :data:`START_S`).
        JtopVersionError: The service is of another major.minor release than the client.
    """
    client = require("jtop", "jetson-stats", "pip install 'edgefold[jetson]'")

    class Client(client.jtop):
        service_version: str | None = None
        library_scan_s: float | None = None  # how long start() waited for jtop's library scan

        def _get_configuration(self):
            # jtop keeps the init message local to start(); the service's version is in it (jtop.py start()).
            init = super()._get_configuration()
            if isinstance(init, dict):
                self.service_version = str(init.get("version")) if init.get("version") is not None else None
            return init

        def _get_data(self):
            # jtop's start() waits three client intervals for the service's first value (0.15 s at 20 Hz), though the
            # service only now starts sampling at this client's interval; a busy board (or a loaded test host)
            # misses that and start() fails with "Error connection". The first value gets FIRST_VALUE_S; later
            # reads keep jtop's own timeout, which is what tells a lost service (jetson-stats 7.2.2, jtop.py start()).
            if not self._running and not self._sync_event.is_set():
                self._sync_event.wait(FIRST_VALUE_S)
            return super()._get_data()

    jetson = Client(interval=interval_s)
    if observer is not None:
        jetson.attach(observer)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            jetson.start()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            failed.append(err)

    starting = threading.Thread(target=run, name="jtop-start", daemon=True)
    starting.start()
    starting.join(START_S)
    if starting.is_alive():  # left behind: a daemon thread blocked on the service's socket ends with the process
        raise MissingDependencyError(f"the jtop service did not answer a new client within {START_S:g} s (its "
                                     "control loop may have stopped)", fix=SERVICE_FIX)
    if failed:
        if isinstance(failed[0], client.JtopException):
            raise start_error(failed[0]) from None
        raise failed[0]
    scan = getattr(jetson, "_thread_libraries", None)
    if scan is not None:
        began = time.monotonic()
        scan.join(LIBRARY_SCAN_S)
        jetson.library_scan_s = round(time.monotonic() - began, 3)
    return jetson


def lost_errors() -> tuple[type[BaseException], ...]:
    """What a lost service raises through the client: jetson-stats 7.2.2 turns the socket's EOF into
    ``JtopException("Lost connection with jtop server")`` (``jtop.py`` _get_data) and ``ok()`` re-raises the reader's
    stored error; a request on a closed socket raises the raw EOFError or BrokenPipeError."""
    try:
        from jtop import JtopException
    except ImportError:
        return (EOFError, OSError)
    return (EOFError, OSError, JtopException)


def probe(socket: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The client's and the service's versions and whether they can talk, asked in a process of its own (importing
    jtop changes its process's multiprocessing start method, so the agent never imports it).

    Returns:
        ``{"client": …, "service": …, "ok": bool, "error": …, "fix": …}``; ``service`` None when no service answered.
    """
    import json
    import subprocess
    import sys

    info: dict[str, Any] = {"client": client_version(), "service": None, "ok": False, "error": None, "fix": None}
    if info["client"] is None:
        info.update(error="jetson-stats is not installed", fix="pip install 'edgefold[jetson]'")
        return info
    try:
        done = subprocess.run([sys.executable, "-m", "device.power.jtop_client", socket], capture_output=True, text=True,
                              timeout=timeout_s)
        info.update(json.loads(done.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as err:
        info.update(error=f"the jtop probe did not answer: {type(err).__name__}: {err}", fix=SERVICE_FIX)
    return info


# The jtop service keeps its first client's interval until it has seen no client for max(3 s, 3 intervals)
# (jtop/service.py at 7.2.2): a probe at 1 s left a job that started within 3 s sampling at 1 Hz whatever it asked
# for. The probe asks for the jobs' default rate (JobSpec.sample_hz, 20 Hz) for the moment it is open.
PROBE_INTERVAL_S = 0.05


def _probe_main(socket: str) -> dict[str, Any]:
    use_socket(socket)
    try:
        jetson = start(PROBE_INTERVAL_S)
    except JtopVersionError as err:
        return {"service": err.service, "client": err.client, "ok": False, "error": err.message, "fix": err.fix}
    except MissingDependencyError as err:
        return {"ok": False, "error": err.message, "fix": err.fix}
    try:
        return {"service": jetson.service_version, "ok": True}
    finally:
        try:
            jetson.close()
        except Exception:  # noqa: BLE001 (closing is best effort: the answer is already read)
            pass


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(_probe_main(sys.argv[1])))

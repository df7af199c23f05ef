"""Files that outlive the process writing them: written whole or not at all, and hashed by content.

Every file another run or process reads back (a latency-table cache entry, a deploy measurement, a
job's ``result.json``) goes through :func:`atomic_writer`: the bytes go to a temporary file in the
same folder, which replaces the target only once it is complete. A kill, a full disk or a value
that cannot be serialized leaves the previous file (or none), never a truncated one that every
later run trips over. Lives on the device side so that the agent and the pipeline share it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

CHUNK = 1 << 20


@contextmanager
def atomic_writer(path: str | os.PathLike, text: bool = False) -> Iterator[IO]:
    """Opens a temporary file beside ``path`` that replaces ``path`` when the block ends without error.

    Args:
        path: The file to write (its folder must exist).
        text: Open in text mode (UTF-8) instead of binary.

    Yields:
        The open temporary file.
    """
    path = Path(path)
    # A name of its own per writer: two processes filling one cache entry must not share a temporary.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    # O_EXCL with 0o666: the usual umask-derived permissions (mkstemp's 0600 would hide reports from others).
    handle = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w" if text else "wb",
                       **({"encoding": "utf-8"} if text else {}))
    try:
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())  # the rename must never land before the bytes (a power cut on a Jetson)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# The temporaries atomic_writer names: ".<name>.<pid>-<8 hex>.tmp".
_TEMPORARY = re.compile(r"^\..+\.\d+-[0-9a-f]{8}\.tmp$")


def sweep_temporaries(folder: str | os.PathLike) -> list[str]:
    """Removes the temporaries :func:`atomic_writer` left in ``folder`` (not below it): a writer killed between
    creating and renaming one (a job cancelled while it wrote its progress) cannot remove its own.

    Call it only when no writer is left in the folder. Returns the names removed.
    """
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if _TEMPORARY.match(entry.name) and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
                removed.append(entry.name)
            except FileNotFoundError:
                pass
    return removed


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Writes ``data`` (text as UTF-8) to ``path`` through :func:`atomic_writer`; returns the path."""
    with atomic_writer(path, text=isinstance(data, str)) as handle:
        handle.write(data)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, value: Any, **dumps: Any) -> Path:
    """Writes ``value`` as JSON through :func:`atomic_writer`.

    No ``default=``: a value JSON cannot hold raises ``TypeError`` before anything is replaced,
    instead of being stored as its ``str()`` and read back as something else.

    Args:
        path: The file to write.
        value: A JSON value (convert paths and the like to str before).
        **dumps: Options for :func:`json.dumps` (``indent``, ``sort_keys``).
    """
    return write_atomic(path, json.dumps(value, **dumps))


def sha256_file(path: str | os.PathLike) -> str:
    """The lowercase hex sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()

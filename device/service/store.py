"""The agent's durable state: jobs and results in SQLite (WAL), artifacts on disk by sha256.

Every state change is one committed transaction, so a ``kill -9`` at any point leaves either the
old or the new state, never a half-written one. Artifacts are written to a temporary file,
verified, then renamed into place: a file under ``artifacts/`` is always complete and correct.

Reading never fails on a row: a stored spec that no longer validates (an upgrade tightened the
schema, a hand edit) fails its job with the reason instead of answering 500, and non-finite numbers
or unencodable text in a stored result are read as ``null`` / escaped text.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from pydantic import ValidationError

from device.errors import ConfigError
from device.service.problems import describe_problems, field_problems, safe_text
from device.schema import FINISHED, SHA256, Artifact, Job, JobSpec

log = logging.getLogger("edgefold.agent")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, spec TEXT NOT NULL, created_at REAL NOT NULL,
    started_at REAL, finished_at REAL, progress TEXT, error TEXT, result TEXT, pid INTEGER, seq INTEGER);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, seq);
CREATE TABLE IF NOT EXISTS artifacts (
    sha256 TEXT PRIMARY KEY, kind TEXT NOT NULL, size_bytes INTEGER NOT NULL, stored_at REAL NOT NULL);
"""
ARTIFACT_SUFFIX = {"onnx": ".onnx", "torch-export": ".pt2", "torch-checkpoint": ".device.pt", "eval-set": ".npy",
                   "image-set": ".images.npy", "detection-head": ".head.json"}
UNREADABLE = "the stored job spec no longer validates ({problems}); this agent cannot run it: submit the job again"


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as None and every string encodable (results come from a child)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def _unreadable(err: ValidationError) -> str:
    return UNREADABLE.format(problems=safe_text(describe_problems(field_problems(err.errors(), limit=5)), 500))


class Store:
    """Jobs, results and artifacts under ``data_dir``.

    Args:
        data_dir: Holds ``agent.db``, ``artifacts/`` and ``jobs/<id>/`` (each job's spec, log, result).
    """

    def __init__(self, data_dir: str | os.PathLike):
        # Absolute, so a job child's command line names its job dir unambiguously (orphan recovery matches it).
        self.root = Path(data_dir).absolute()
        self.artifacts = self.root / "artifacts"
        self.jobs_dir = self.root / "jobs"
        for folder in (self.root, self.artifacts, self.jobs_dir, self.root / "tmp"):
            folder.mkdir(parents=True, exist_ok=True)
        self.db_path = self.root / "agent.db"
        self._lock = threading.Lock()
        self.finished_total: dict[str, int] = {}  # every terminal transition this process made, by state
        # Bumped by every write to a job row: a long-polling GET compares it in memory instead of reading the
        # database at its poll rate (this process is the database's only writer).
        self._change_numbers = itertools.count(1)  # next() is atomic: the API's threads and the executor's share it
        self.job_changes = 0
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    def _changed(self) -> None:
        self.job_changes = next(self._change_numbers)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # A connection per operation: the API's threads and the executor thread never share one.
        db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=NORMAL")
        try:
            yield db
        finally:
            db.close()

    # ----------------------------------------------------------------- artifacts
    def artifact_path(self, sha256: str, kind: str) -> Path:
        if not SHA256.match(sha256):
            raise ConfigError(f"not a sha256: {sha256!r}", fix="name artifacts by the lowercase hex sha256 of their bytes")
        return self.artifacts / f"{sha256}{ARTIFACT_SUFFIX[kind]}"

    def temp_file(self) -> Path:
        return self.root / "tmp" / f"{uuid.uuid4().hex}.part"

    def add_artifact(self, sha256: str, kind: str, verified_file: Path) -> Artifact:
        """Moves an already verified file into place and records it."""
        path = self.artifact_path(sha256, kind)
        os.replace(verified_file, path)
        artifact = Artifact(sha256=sha256, kind=kind, size_bytes=path.stat().st_size, stored_at=time.time())
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO artifacts VALUES (?, ?, ?, ?)",
                       (artifact.sha256, artifact.kind, artifact.size_bytes, artifact.stored_at))
        return artifact

    def get_artifact(self, sha256: str) -> tuple[Artifact, Path] | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM artifacts WHERE sha256 = ?", (sha256,)).fetchone()
        if row is None:
            return None
        artifact = Artifact(**dict(row))
        path = self.artifact_path(sha256, artifact.kind)
        return (artifact, path) if path.is_file() else None

    def artifact_totals(self) -> tuple[int, int]:
        with self._connect() as db:
            count, size = db.execute("SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM artifacts").fetchone()
        return int(count), int(size)

    # ----------------------------------------------------------------- jobs
    def _count(self, state: str) -> None:
        self.finished_total[state] = self.finished_total.get(state, 0) + 1

    def _job(self, row: sqlite3.Row) -> Job:
        """The row as a Job; a spec that no longer validates fails a queued or running job for that reason."""
        try:
            spec = JobSpec.model_validate_json(row["spec"])
        except ValidationError as err:
            spec = None
            if row["state"] in ("queued", "running") and self.finish(row["id"], "failed", error=_unreadable(err)):
                log.warning("job %s failed on read: its stored spec no longer validates", row["id"])
                with self._connect() as db:
                    row = db.execute("SELECT * FROM jobs WHERE id = ?", (row["id"],)).fetchone()
        return Job(id=row["id"], state=row["state"], spec=spec, created_at=row["created_at"],
                   started_at=row["started_at"], finished_at=row["finished_at"],
                   progress=safe_text(row["progress"]) if row["progress"] is not None else None,
                   error=safe_text(row["error"]) if row["error"] is not None else None,
                   result=self._result(row["id"], row["result"]))

    @staticmethod
    def _result(job_id: str, text: str | None) -> dict[str, Any] | None:
        if not text:
            return None
        try:
            result = json.loads(text)
        except ValueError:
            log.warning("job %s: its stored result is not JSON; served as null", job_id)
            return None
        return json_safe(result) if isinstance(result, dict) else None

    def submit(self, spec: JobSpec) -> Job:
        job_id = uuid.uuid4().hex[:12]
        with self._lock, self._connect() as db:
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
            db.execute("INSERT INTO jobs (id, state, spec, created_at, seq) VALUES (?, 'queued', ?, ?, ?)",
                       (job_id, spec.model_dump_json(), time.time(), seq))
        self._changed()
        return self.get(job_id)

    def get(self, job_id: str) -> Job | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return self._job(row) if row else None

    def list(self, state: str | None = None, limit: int = 100) -> list[Job]:
        query, args = "SELECT * FROM jobs", []
        if state:
            query, args = query + " WHERE state = ?", [state]
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
        return [self._job(row) for row in rows]

    def counts(self) -> dict[str, int]:
        with self._connect() as db:
            rows = db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {state: count for state, count in rows}

    def claim_next(self) -> Job | None:
        """Marks the oldest queued job running and returns it (None when the queue is empty).

        A queued job whose stored spec no longer validates is failed on the way, in the same
        transaction, so one bad row can never block the queue.
        """
        failed = 0
        with self._lock, self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                while True:
                    row = db.execute("SELECT * FROM jobs WHERE state = 'queued' ORDER BY seq LIMIT 1").fetchone()
                    if row is None:
                        break
                    try:
                        spec = JobSpec.model_validate_json(row["spec"])
                    except ValidationError as err:
                        db.execute("UPDATE jobs SET state = 'failed', finished_at = ?, error = ? WHERE id = ?",
                                   (time.time(), _unreadable(err), row["id"]))
                        log.warning("job %s failed: its stored spec no longer validates", row["id"])
                        failed += 1
                        continue
                    started = time.time()
                    db.execute("UPDATE jobs SET state = 'running', started_at = ? WHERE id = ?", (started, row["id"]))
                    break
                db.execute("COMMIT")
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:  # the failed statement may have ended the transaction already
                    pass
                raise
            for _ in range(failed):
                self._count("failed")
            self._changed()
        if row is None:
            return None
        return Job(id=row["id"], state="running", spec=spec, created_at=row["created_at"], started_at=started)

    def set_pid(self, job_id: str, pid: int | None) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET pid = ? WHERE id = ?", (pid, job_id))

    def set_progress(self, job_id: str, progress: str) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET progress = ? WHERE id = ? AND state = 'running'",
                       (safe_text(progress, 500), job_id))
        self._changed()

    def finish(self, job_id: str, state: str, result: dict[str, Any] | None = None, error: str | None = None) -> bool:
        """Records a job's end; False when it had already finished (e.g. cancelled meanwhile).

        Every terminal transition goes through here (the executor's, a cancel's, recovery's, a
        failure on read), so :attr:`finished_total` counts them all.
        """
        if state not in FINISHED:
            raise ValueError(state)
        stored = json.dumps(json_safe(result), allow_nan=False) if result is not None else None
        with self._lock, self._connect() as db:
            cursor = db.execute(
                "UPDATE jobs SET state = ?, finished_at = ?, result = ?, error = ?, pid = NULL "
                "WHERE id = ? AND state IN ('queued', 'running')",
                (state, time.time(), stored, safe_text(error) if error is not None else None, job_id))
            if cursor.rowcount == 1:
                self._count(state)
                self._changed()
        return cursor.rowcount == 1

    def running_pids(self) -> list[tuple[str, int | None]]:
        with self._connect() as db:
            return [(row["id"], row["pid"]) for row in db.execute("SELECT id, pid FROM jobs WHERE state = 'running'")]

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

"""The agent's durable state: jobs and results in SQLite (WAL), artifacts on disk by sha256.

Every state change is one committed transaction, so a ``kill -9`` at any point leaves either the
old or the new state, never a half-written one. Artifacts are written to a temporary file,
verified, then renamed into place: a file under ``artifacts/`` is always complete and correct.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from device.errors import ConfigError
from device.schema import FINISHED, SHA256, Artifact, Job, JobSpec

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, spec TEXT NOT NULL, created_at REAL NOT NULL,
    started_at REAL, finished_at REAL, progress TEXT, error TEXT, result TEXT, pid INTEGER, seq INTEGER);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, seq);
CREATE TABLE IF NOT EXISTS artifacts (
    sha256 TEXT PRIMARY KEY, kind TEXT NOT NULL, size_bytes INTEGER NOT NULL, stored_at REAL NOT NULL);
"""
ARTIFACT_SUFFIX = {"onnx": ".onnx", "torch-export": ".pt2"}


class Store:
    """Jobs, results and artifacts under ``data_dir``.

    Args:
        data_dir: Holds ``agent.db``, ``artifacts/`` and ``jobs/<id>/`` (each job's spec, log, result).
    """

    def __init__(self, data_dir: str | os.PathLike):
        self.root = Path(data_dir)
        self.artifacts = self.root / "artifacts"
        self.jobs_dir = self.root / "jobs"
        for folder in (self.root, self.artifacts, self.jobs_dir, self.root / "tmp"):
            folder.mkdir(parents=True, exist_ok=True)
        self.db_path = self.root / "agent.db"
        self._lock = threading.Lock()
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

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
    def _job(self, row: sqlite3.Row) -> Job:
        return Job(id=row["id"], state=row["state"], spec=JobSpec.model_validate_json(row["spec"]),
                   created_at=row["created_at"], started_at=row["started_at"], finished_at=row["finished_at"],
                   progress=row["progress"], error=row["error"],
                   result=json.loads(row["result"]) if row["result"] else None)

    def submit(self, spec: JobSpec) -> Job:
        job_id = uuid.uuid4().hex[:12]
        with self._lock, self._connect() as db:
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
            db.execute("INSERT INTO jobs (id, state, spec, created_at, seq) VALUES (?, 'queued', ?, ?, ?)",
                       (job_id, spec.model_dump_json(), time.time(), seq))
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
        """Marks the oldest queued job running and returns it (None when the queue is empty)."""
        with self._lock, self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT id FROM jobs WHERE state = 'queued' ORDER BY seq LIMIT 1").fetchone()
            if row is None:
                db.execute("COMMIT")
                return None
            db.execute("UPDATE jobs SET state = 'running', started_at = ? WHERE id = ?", (time.time(), row["id"]))
            db.execute("COMMIT")
        return self.get(row["id"])

    def set_pid(self, job_id: str, pid: int | None) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET pid = ? WHERE id = ?", (pid, job_id))

    def set_progress(self, job_id: str, progress: str) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET progress = ? WHERE id = ? AND state = 'running'", (progress, job_id))

    def finish(self, job_id: str, state: str, result: dict[str, Any] | None = None, error: str | None = None) -> bool:
        """Records a job's end; False when it had already finished (e.g. cancelled meanwhile)."""
        if state not in FINISHED:
            raise ValueError(state)
        with self._lock, self._connect() as db:
            cursor = db.execute(
                "UPDATE jobs SET state = ?, finished_at = ?, result = ?, error = ?, pid = NULL "
                "WHERE id = ? AND state IN ('queued', 'running')",
                (state, time.time(), json.dumps(result) if result is not None else None, error, job_id))
        return cursor.rowcount == 1

    def running_pids(self) -> list[tuple[str, int | None]]:
        with self._connect() as db:
            return [(row["id"], row["pid"]) for row in db.execute("SELECT id, pid FROM jobs WHERE state = 'running'")]

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

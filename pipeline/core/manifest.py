"""The run manifest: the one contract between stages.

``runs/<model>/<run-id>/manifest.json`` records, per stage, the hash of its config and of
its inputs, the sha256 of every output, its metrics, environment and wall time. A stage
whose config and inputs are unchanged and whose outputs are intact is skipped.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from device.errors import ManifestError
from device.files import sha256_file, write_atomic

SCHEMA = "edgefold.manifest/1"
MANIFEST = "manifest.json"


def sha256_json(data: Any) -> str:
    """Hash of a JSON-able value, independent of key order."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Manifest:
    """Reads and atomically rewrites one run's ``manifest.json``."""

    def __init__(self, run_dir: Path, data: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self.data = data

    @property
    def path(self) -> Path:
        return self.run_dir / MANIFEST

    @classmethod
    def open(cls, run_dir: Path, model: str) -> "Manifest":
        """Loads the run's manifest, or starts a new one (not saved until :meth:`save`)."""
        run_dir = Path(run_dir)
        path = run_dir / MANIFEST
        if path.exists():
            manifest = cls.load(run_dir)
            if manifest.data.get("model") != model:
                raise ManifestError(
                    f"{run_dir} belongs to model {manifest.data.get('model')!r}, not {model!r}",
                    fix="choose another RUN= (or omit it to start a new run)",
                )
        else:
            manifest = cls(run_dir, {"schema": SCHEMA, "model": model, "created": _now(), "stages": {}})
        return manifest

    @classmethod
    def load(cls, run_dir: Path) -> "Manifest":
        path = Path(run_dir) / MANIFEST
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ManifestError(f"{run_dir} has no {MANIFEST}", fix="run `edgefold runs` to list runs") from None
        except json.JSONDecodeError as err:
            raise ManifestError(f"{path} is corrupt: {err}", fix=f"delete {run_dir} and run again") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("stages"), dict):
            raise ManifestError(f"{path} is not an {SCHEMA} manifest", fix=f"delete {run_dir} and run again")
        return cls(Path(run_dir), data)

    def stage(self, name: str) -> dict[str, Any] | None:
        return self.data["stages"].get(name)

    def output(self, stage: str, key: str) -> Path:
        """Absolute path of an output an earlier stage recorded.

        Raises:
            ManifestError: If that stage has not run in this run directory.
        """
        entry = self.stage(stage)
        if not entry or key not in entry.get("outputs", {}):
            raise ManifestError(f"stage {stage!r} has not recorded output {key!r} in {self.run_dir}",
                                fix=f"run the pipeline through {stage} first (edgefold run MODEL --until {stage})")
        return self.run_dir / entry["outputs"][key]

    def record(self, name: str, entry: dict[str, Any], order: tuple[str, ...] = ()) -> None:
        """Stores a stage's entry; ``order`` keeps the stages in pipeline order after a re-run."""
        stages = {**self.data["stages"], name: entry}
        rank = {stage: index for index, stage in enumerate(order)}
        self.data["stages"] = dict(sorted(stages.items(), key=lambda item: rank.get(item[0], len(rank))))
        self.save()

    def forget(self, name: str) -> None:
        if self.data["stages"].pop(name, None) is not None:
            self.save()

    def save(self) -> None:
        self.data["updated"] = _now()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=False) + "\n")

    def outputs_intact(self, name: str) -> bool:
        """True when every recorded output exists with its recorded sha256."""
        entry = self.stage(name) or {}
        for rel, digest in entry.get("sha256", {}).items():
            path = self.run_dir / rel
            if not path.is_file() or sha256_file(path) != digest:
                return False
        return bool(entry.get("sha256"))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")

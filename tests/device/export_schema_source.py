"""Builds ``device/assets/export_schema.json``, the closed schema of a ``torch.export`` archive's JSON documents, from
torch's own description of them (``torch/_export/serde/schema.yaml``, one per release, ``@generated`` from
``schema.py``): the union of the structs, fields and types of every release read.

    python -m tests.device.export_schema_source OLD_SCHEMA.yaml …   # rewrites the asset with the installed torch's

The asset records which schema versions it covers; ``tests/device/test_program_schema.py`` fails when the installed
torch writes a struct, field or type the asset lacks (then run this with the asset's older files and the new one).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ASSET = Path(__file__).resolve().parents[2] / "device" / "assets" / "export_schema.json"


def installed_schema_yaml() -> Path:
    import torch

    return Path(torch.__file__).parent / "_export" / "serde" / "schema.yaml"


def read_schema(text: str) -> tuple[str, dict]:
    """(``major.minor``, {type name: {"kind", "fields"}}) of one release's schema.yaml."""
    import yaml

    document = yaml.safe_load(text)
    version = ".".join(str(part) for part in document["SCHEMA_VERSION"])
    types = {}
    for name, entry in document.items():
        if not isinstance(entry, dict):
            continue
        if entry["kind"] == "enum":
            types[name] = {"kind": "enum", "values": {key: int(value) for key, value in entry["fields"].items()}}
        else:
            types[name] = {"kind": entry["kind"],
                           "fields": {field: [spec["type"]] for field, spec in entry["fields"].items()}}
    return version, types


def merge(releases: list[tuple[str, dict]], previous: dict | None = None) -> dict:
    """The union of releases' types (a field whose type changed keeps every type it had)."""
    merged = {name: json.loads(json.dumps(entry)) for name, entry in (previous or {}).get("types", {}).items()}
    versions = set((previous or {}).get("schema_versions", []))
    for version, types in releases:
        versions.add(version)
        for name, entry in types.items():
            into = merged.setdefault(name, {"kind": entry["kind"], **({"values": {}} if entry["kind"] == "enum"
                                                                        else {"fields": {}})})
            if entry["kind"] == "enum":
                into["values"].update(entry["values"])
            else:
                for field, kinds in entry["fields"].items():
                    known = into["fields"].setdefault(field, [])
                    known.extend(kind for kind in kinds if kind not in known)
    ordered = sorted(versions, key=lambda v: tuple(int(p) for p in v.split(".")))
    return {"source": "torch/_export/serde/schema.yaml of each release, merged by tests/device/export_schema_source.py",
            "schema_versions": ordered, "types": dict(sorted(merged.items()))}


def main(paths: list[str]) -> None:
    previous = json.loads(ASSET.read_text()) if ASSET.exists() else None
    releases = [read_schema(Path(p).read_text()) for p in [*paths, installed_schema_yaml()]]
    ASSET.write_text(json.dumps(merge(releases, previous), indent=1, sort_keys=False) + "\n")
    print(f"wrote {ASSET}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""What ``edgefold diverge`` found, in the report: each answer in ``<run>/diverge/`` as a line and a table of the
debug jobs it took (:mod:`pipeline.deploy.diverge` writes them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.report.sections import Section, Table, Text

DIVERGE_SCHEMA = "edgefold.diverge/1"


def diverge_answers(run_dir: str | Path) -> list[dict[str, Any]]:
    """The answers recorded for this run, by rung and device; a file of another schema is skipped."""
    answers = []
    for path in sorted((Path(run_dir) / "diverge").glob("*.json")):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(document, dict) and document.get("schema") == DIVERGE_SCHEMA:
            answers.append(document)
    return answers


def _shown(value: float | None) -> str:
    return "not finite" if value is None else f"{value:.3g}"


def answer_text(document: dict[str, Any]) -> str:
    """One line of the answer, for the terminal and the report."""
    first = document.get("first_parting")
    where = f"{document['rung']} on {document['device']}"
    if first is None:
        return (f"{where}: the debug engine's output (built with outputs marked, which can change TensorRT's "
                f"fusions) agrees with ONNX Runtime's on {document['images']} images "
                f"(relative error ≤ {document['thresholds']['max_relative_error']}, cosine distance ≤ "
                f"{document['thresholds']['max_cosine_distance']}); {document['jobs']} debug job(s)")
    agreeing = document.get("last_agreeing")
    return (f"{where}: the engine (batch {document.get('batch_size')}) first parts from ONNX Runtime at "
            f"{first['name']!r} (node {first['node']}, "
            f"{first['op']}; tensor {first['index'] + 1} of {document['tensors_in_order']} in graph order): relative "
            f"error {_shown(first['relative_error'])}, cosine distance {_shown(first['cosine_distance'])}"
            + (f"; {agreeing['name']!r} before it agrees" if agreeing else "; the first tensor already parts")
            + f" ({document['jobs']} debug jobs)")


def diverge_section(run_dir: str | Path) -> list[Section]:
    """"Where the engine parts from the model": one answer per rung × device searched, with its debug jobs."""
    answers = diverge_answers(run_dir)
    if not answers:
        return []
    blocks: list = [Text("edgefold diverge marked a few tensors of the rung's graph as outputs in each debug job on "
                         "the device, compared them with ONNX Runtime's values on the build host, and bisected over "
                         "the graph's order to the first tensor that parts (the worst image's relative L2 error or "
                         "cosine distance over the thresholds).")]
    for answer in answers:
        rows = [["job", "tensors marked", "parted", "worst relative error"]]
        for index, probe in enumerate(answer["probes"], start=1):
            errors = [m["relative_error"] for m in probe["metrics"].values()]
            worst = "not finite" if any(e is None for e in errors) else f"{max(errors):.3g}"
            rows.append([f"{index} ({probe.get('job') or '—'})", ", ".join(probe["tensors"]),
                         ", ".join(probe["parted"]) or "none", worst])
        blocks += [Text(answer_text(answer)), Table(rows)]
    return [Section("Where the engine parts from the model", blocks)]

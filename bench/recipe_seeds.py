"""A shipped recipe over seeds: do its own gates hold on every seed, and what are its figures with their spread?

    python bench/recipe_seeds.py --recipe tiny --seeds 5          # resumable; writes bench/results/seeds-tiny-*.{json,md}
    python bench/recipe_seeds.py --recipe tiny-det --seeds 5 --until evaluate

Goal, stated before the run: every stage's gate (the sanity gates of teacher and student, the quantize stage's
accuracy budget through its fallbacks) passes on every seed, unchanged recipe, on this machine. Seed *s* sets
``data.seed`` (the split and the calibration subset), ``teacher.train.seed`` and ``distill.train.seed`` (the batches
and initialisation) together, so each seed is a different draw of the whole experiment; nothing is tuned on the test
split (the recipe is taken as shipped). Every run is reported: its figures, which calibration method the quantize
stage settled on, each stage's seconds, and a failed gate with its message. Over seeds, each figure gets its mean and
a Student's t 95% interval. The machine is recorded (CPU model, vector extensions, cores): a CPU with other kernels
trains to other weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

GOAL = ("every stage's gate passes on every seed with the recipe as shipped (teacher and student sanity, the quantize "
        "stage's accuracy budget through its fallbacks)")
SEED_KEYS = ("data.seed", "teacher.train.seed", "distill.train.seed")
FIGURES = (("teacher", "teacher"), ("student", "distill"), ("INT8", "quantize"))
BUILD_STAGES = ("data", "teacher", "prune", "distill", "export", "quantize", "evaluate")
# Over seeds, in points (top-1, mAP or mIoU) but for the MACs: the figures, then the fold's changes.
FIGURE_ROWS = ("teacher", "student", "INT8", "student_macs_percent", "student_change", "int8_change", "int8_drop_points")


def machine() -> dict[str, Any]:
    """The CPU as ``lscpu`` would name it: model, the vector extensions that change kernels, cores."""
    model, flags = platform.processor() or "unknown", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = re.search(r"^model name\s*:\s*(.+)$", text, re.M).group(1).strip()
        flags = set(re.search(r"^flags\s*:\s*(.+)$", text, re.M).group(1).split())
    except (OSError, AttributeError):
        pass
    vector = sorted(f for f in flags if f.startswith(("avx2", "avx512", "amx")) or f in ("fma", "f16c"))
    kernels = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "other"
    # PyTorch's and oneDNN's kernels chosen below what the CPU has: another experiment, and the record says so.
    forced = {name: os.environ[name] for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if os.environ.get(name)}
    if forced:
        kernels = (f"{forced.get('ATEN_CPU_CAPABILITY', kernels).upper().replace('AVX512', 'AVX-512')} (forced: "
                   + ", ".join(f"{name}={value}" for name, value in forced.items()) + f"; the CPU has {kernels})")
    return {"cpu": model, "vector_flags": vector, "cores": os.cpu_count(), "machine": platform.machine(),
            "kernels": kernels}


def provenance(recipe: str, data: str | None = None) -> dict[str, Any]:
    """What else the figures depend on: the commit, the lock's sha256 and the data set (``data``, else the recipe's
    source, a folder named by its last part: another machine's path says nothing)."""
    from pipeline.core.recipe import load_recipe

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                capture_output=True, text=True).stdout.strip())
    lock = REPO / "constraints.txt"
    return {"commit": (commit + ("+uncommitted" if dirty else "")) or None,
            "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest() if lock.is_file() else None,
            "data": data or _data_name(load_recipe(recipe)[0])}


def _data_name(config) -> str:
    """``<source> at <side> px``: classification's ``preprocess.input_size``, the other tasks' ``input_size()``."""
    kind, _, where = str(config.data.source).partition(":")
    name = f"{kind}:{Path(where.split('@')[0]).name}" if where.startswith("/") else str(config.data.source)
    preprocess = getattr(config, "preprocess", None)
    side = preprocess.input_size if preprocess is not None else config.input_size()
    return f"{name} at {side} px"


def experiment_key(recipe: str) -> str:
    """What the recorded seeds measured: the sha256 of the project's sources and of the recipe. A resumed bench
    keeps only the seeds run with this key; after any change to the code or the recipe they are another experiment."""
    from pipeline.core.recipe import resolve_recipe_path

    digest = hashlib.sha256()
    root = HERE.parent
    for path in sorted([*root.glob("pipeline/**/*.py"), *root.glob("device/**/*.py"), resolve_recipe_path(recipe)]):
        digest.update(str(path.relative_to(root) if path.is_relative_to(root) else path).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def score(metrics: dict[str, Any]) -> float | None:
    """The stage's headline metric in points: top-1 for classification, mAP for detection, mIoU for segmentation."""
    for key in ("top1", "map", "mAP", "miou"):
        if isinstance(metrics.get(key), (int, float)):
            return 100 * metrics[key]
    return None


def one_run(recipe: str, seed: int, runs: Path, until: str | None) -> dict[str, Any]:
    from device.errors import EdgeFoldError
    from pipeline.runner import run_pipeline

    overrides = {key: seed for key in SEED_KEYS}
    started = time.perf_counter()
    record: dict[str, Any] = {"seed": seed, "overrides": overrides, "passed": True, "failed_stage": None, "error": None}
    try:
        run_pipeline(recipe, runs_dir=runs, run_id=f"seed{seed}", overrides=overrides, until=until)
    except EdgeFoldError as err:  # a gate that refused: recorded, and the next seed runs
        record.update(passed=False, error=str(err).splitlines()[0][:400])
    record["wall_s"] = round(time.perf_counter() - started, 1)  # this call's (a resumed run finds stages cached)
    found = next(runs.glob(f"*/seed{seed}/manifest.json"), None)  # none: a preflight refused before any stage
    stages = json.loads(found.read_text()).get("stages", {}) if found else {}
    # Each stage's time as recorded when it ran: the first run's cost, however often the benchmark resumed. Deploy
    # and report run again on every resume (reusing the measurements), so the figure is the build side's stages.
    record["stage_seconds"] = {name: stage.get("seconds") for name, stage in stages.items()}
    record["build_seconds"] = round(sum(record["stage_seconds"].get(name) or 0 for name in BUILD_STAGES), 1)
    if not record["passed"]:
        order = list(stages)
        record["failed_stage"] = next((s for s in ("data", "teacher", "prune", "distill", "export", "quantize",
                                                   "evaluate", "deploy", "report") if s not in order), None)
    for label, stage in FIGURES:
        metrics = (stages.get(stage) or {}).get("metrics") or {}
        # Detection's quantize stage keeps the INT8 rung's scores under "int8" (classification's at the top).
        record[label] = score(metrics["int8"] if isinstance(metrics.get("int8"), dict) else metrics)
    fraction = ((stages.get("prune") or {}).get("metrics") or {}).get("macs_fraction")
    record["student_macs_percent"] = None if fraction is None else round(100 * fraction, 2)
    quantize = (stages.get("quantize") or {}).get("metrics") or {}
    record["quantize_method"] = quantize.get("method")
    record["int8_drop_points"] = quantize.get("drop_points")
    return record


def t_interval(values: list[float]) -> tuple[float, float, float] | None:
    if not values:
        return None
    from scipy import stats

    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = stats.t.ppf(0.975, len(values) - 1) * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {"seeds": len(runs), "passed": sum(r["passed"] for r in runs), "goal_met": all(r["passed"] for r in runs)}
    for r in runs:  # the changes the fold made, per run: the student against the teacher, INT8 against the student
        r["student_change"] = None if None in (r.get("student"), r.get("teacher")) else r["student"] - r["teacher"]
        r["int8_change"] = None if None in (r.get("INT8"), r.get("student")) else r["INT8"] - r["student"]
    for label in (*FIGURE_ROWS, "build_seconds"):
        values = [r[label] for r in runs if isinstance(r.get(label), (int, float))]
        interval = t_interval(values)
        out[label] = None if interval is None else {"mean": interval[0], "low": interval[1], "high": interval[2],
                                                     "n": len(values)}
    return out


def markdown(doc: dict[str, Any]) -> str:
    m, s = doc["machine"], doc["summary"]
    lines = [f"## {doc['recipe']} over {s['seeds']} seeds", "", f"Goal, stated before the run: {doc['goal']}.", "",
             f"**Goal {'MET' if s['goal_met'] else 'NOT MET'}**: {s['passed']} of {s['seeds']} seeds passed every "
             f"gate. Machine: {m['cpu']}, {m['cores']} cores, {m['kernels']} kernels "
             f"({', '.join(m['vector_flags'])}); {doc['date']}.", "",
             "| figure | mean over seeds [95% t interval] |", "|---|---|"]
    for label in (*FIGURE_ROWS, "build_seconds"):
        f = s.get(label)
        if f:
            lines.append(f"| {label} | {f['mean']:.2f} [{f['low']:.2f}, {f['high']:.2f}] (n={f['n']}) |")
    stage_names = [name for name in (*BUILD_STAGES, "deploy", "report")
                   if any((r.get("stage_seconds") or {}).get(name) is not None for r in doc["runs"])]
    lines += ["", "Seconds each stage took, per run (the first time it ran):", "",
              "| seed | " + " | ".join(stage_names) + " |", "|---" * (len(stage_names) + 1) + "|"]
    for r in doc["runs"]:
        times = r.get("stage_seconds") or {}
        lines.append(f"| {r['seed']} | " + " | ".join("—" if times.get(n) is None else f"{times[n]:.0f}"
                                                      for n in stage_names) + " |")
    lines += ["", "Every run:", "", "| seed | passed | teacher | student | INT8 | INT8 − student | method | build s | "
              "failed gate |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        cell = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
        lines.append(f"| {r['seed']} | {'yes' if r['passed'] else 'NO'} | {cell(r['teacher'])} | {cell(r['student'])} | "
                     f"{cell(r['INT8'])} | {cell(r['int8_drop_points'] and -r['int8_drop_points'])} | "
                     f"{r['quantize_method'] or '—'} | {r['build_seconds']} | {r['error'] or ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True, help="a recipe under models/ or a path")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--work", type=Path, help="runs folder (default: /tmp/edgefold-seeds-RECIPE); resumable")
    parser.add_argument("--until", help="stop each run after this stage (default: the whole run)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--goal", default=GOAL, help="the goal to state before the run (a bench that calls this one)")
    parser.add_argument("--data", help="the data set's name in the record (default: the recipe's data source)")
    args = parser.parse_args(argv)
    work = args.work or Path(f"/tmp/edgefold-seeds-{Path(args.recipe).stem}")
    state_path = work / "state.json"
    key = experiment_key(args.recipe)
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    if state and state.get("experiment") != key:
        print(f"{state_path}: its seeds ran other code or another recipe; starting over", flush=True)
        state = {}
        shutil.rmtree(work / "runs", ignore_errors=True)
    state["experiment"] = key
    print(f"goal: {args.goal}", flush=True)
    for seed in range(args.seeds):
        if str(seed) in state:
            continue
        record = one_run(args.recipe, seed, work / "runs", args.until)
        state[str(seed)] = record
        work.mkdir(parents=True, exist_ok=True)
        state_path.write_text(json.dumps(state, indent=1))
        print(f"seed {seed}: {'passed' if record['passed'] else 'FAILED ' + str(record['error'])} "
              f"teacher {record['teacher']} student {record['student']} INT8 {record['INT8']} "
              f"({record['build_seconds']} s data to evaluate)", flush=True)
    runs = [state[str(s)] for s in range(args.seeds)]
    doc = {"schema": "edgefold.bench.seeds/1", "recipe": Path(args.recipe).stem, "date": time.strftime("%Y-%m-%d"),
           "goal": args.goal, "seed_keys": list(SEED_KEYS), "until": args.until, "machine": machine(), "experiment": key,
           "provenance": provenance(args.recipe, args.data), "runs": runs,
           "summary": summary(runs)}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / f"seeds-{doc['recipe']}-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    base.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))
    return 0 if doc["summary"]["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())

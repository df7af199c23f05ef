"""Do the ladder's ratios survive a busy host? Five deploys of one run, a CPU hog started and stopped at random.

Each repetition deploys the run's rungs to a fresh loopback agent twice: the new way (interleaved
rounds, paired intervals, noisy windows flagged) and the old way (one window per rung, one rung after
the other). In some repetitions another CPU-heavy process runs for a random stretch. Reported per
repetition: the student/teacher latency ratio with its 95% interval, the old-way ratio, whether the
hog overlapped the measurement, and whether the report flagged the windows as noisy.

    .venv/bin/python bench/interleave.py --run runs/resnet50/latest [--repeats 5]

Goal: the five intervals all overlap, and every repetition that overlapped the busy process
is flagged. Results go to bench/results/interleave-<model>-<time>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"


def hog_at(start_s: float, seconds: float, log: list) -> threading.Thread:
    """Starts a busy process after ``start_s`` for ``seconds``; records when it ran (monotonic → wall)."""
    def run():
        time.sleep(start_s)
        began = time.time()
        subprocess.run([sys.executable, "-c", HOG.format(seconds=seconds)], check=False)
        log.append((began, time.time()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def deploy(run_dir: Path, overrides: dict, tag: str) -> dict:
    """Runs the deploy stage alone on ``run_dir`` (its earlier stages as recorded, whatever the code
    version now) and returns the report's data for that measurement."""
    from pipeline.core.context import RunContext
    from pipeline.core.manifest import Manifest
    from pipeline.core.recipe import load_recipe
    from pipeline.tasks.classification.report_data import collect
    from pipeline.tasks.classification import TASK

    manifest = Manifest.load(run_dir)
    recipe, _, _ = load_recipe(manifest.data["recipe"]["path"], overrides)
    shutil.rmtree(run_dir / "deploy-cache", ignore_errors=True)
    workdir = run_dir / f"deploy-{tag}"
    workdir.mkdir()
    started = time.time()
    result = TASK.stages.get("deploy").run(RunContext(recipe, manifest), workdir)
    ended = time.time()
    data = json.loads(json.dumps(manifest.data))
    data["stages"]["deploy"] = {"outputs": {"results": str(result.outputs["results"].relative_to(run_dir))}}
    report = collect(data, run_dir)
    report["_window"] = (started, ended)
    return report


def student_row(data: dict) -> dict:
    return next(r for r in data["rows"] if r["rung"] == "student_int8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a run directory with export and quantize done")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("EDGEFOLD_PROGRESS", "0")
    source = Path(args.run).resolve()
    model = json.loads((source / "manifest.json").read_text())["model"]
    rng = random.Random(args.seed)
    rungs = ["teacher", "student", "student_int8"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgefold-interleave-") as tmp:
        for repeat in range(1, args.repeats + 1):
            run_dir = Path(tmp) / model / f"r{repeat}"
            shutil.copytree(source, run_dir, symlinks=True, ignore=shutil.ignore_patterns("deploy-cache"))
            busy = repeat % 2 == 0 or rng.random() < 0.3
            hog_log: list = []
            hogs = [hog_at(rng.uniform(2, 20), rng.uniform(8, 25), hog_log)] if busy else []
            new = deploy(run_dir, {"deploy.rungs": rungs, "deploy.rounds": args.rounds,
                                   "deploy.duration_s": args.duration_s}, "interleaved")
            for hog in hogs:
                hog.join()
            old = deploy(run_dir, {"deploy.rungs": rungs, "deploy.rounds": 1,
                                   "deploy.duration_s": args.duration_s * args.rounds}, "sequential")
            row, old_row = student_row(new), student_row(old)
            overlapped = any(began < new["_window"][1] and ended > new["_window"][0] for began, ended in hog_log)
            flags = sorted({flag for r in new["rows"] for flag in r.get("noise_flags") or []})
            rows.append({"repeat": repeat, "busy_process": busy, "overlapped": overlapped,
                         "ratio": row["latency_ratio_vs_dc_teacher"], "low": row["latency_ratio_low"],
                         "high": row["latency_ratio_high"], "significant": row["latency_ratio_significant"],
                         "flagged": any(r.get("noisy") for r in new["rows"]), "flags": flags,
                         "old_ratio": old_row["latency_ratio_vs_dc_teacher"],
                         "teacher_p50_ms": next(r for r in new["rows"] if r["rung"] == "teacher")["latency_p50_ms"],
                         "student_int8_p50_ms": row["latency_p50_ms"]})
            print(json.dumps(rows[-1]), flush=True)
    low = max(r["low"] for r in rows)
    high = min(r["high"] for r in rows)
    overlap = low <= high
    caught = all(r["flagged"] for r in rows if r["overlapped"])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"model": model, "rounds": args.rounds, "duration_s": args.duration_s, "rows": rows,
               "intervals_overlap": overlap, "common_interval": [low, high] if overlap else None,
               "every_busy_run_flagged": caught,
               "old_ratio_range": [min(r["old_ratio"] for r in rows), max(r["old_ratio"] for r in rows)]}
    (out / f"interleave-{model}-{stamp}.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"## Interleaved rounds on a busy host: {model} ({stamp})", "",
             f"student INT8 / teacher latency p50 on a loopback agent, {args.rounds} rounds × {args.duration_s} s "
             "windows; old way: one window per rung, rungs one after the other, same total time.", "",
             "| run | busy process | overlapped | ratio [95% CI] | flagged (why) | old-way ratio |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['repeat']} | {'yes' if r['busy_process'] else 'no'} | {'yes' if r['overlapped'] else 'no'} "
                     f"| {r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}] | "
                     f"{'yes (' + ', '.join(r['flags']) + ')' if r['flagged'] else 'no'} | {r['old_ratio']:.2f} |")
    lines += ["", f"Intervals overlap: {'yes, all in [' + f'{low:.2f}, {high:.2f}' + ']' if overlap else 'no'}; "
              f"every run that overlapped the busy process flagged: {'yes' if caught else 'no'}; old-way ratios "
              f"{summary['old_ratio_range'][0]:.2f}–{summary['old_ratio_range'][1]:.2f}."]
    (out / f"interleave-{model}-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

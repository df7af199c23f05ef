"""Times `edgefold run MODEL` on this machine: a first run in a new run directory, then the
cached re-run, and records per-stage wall time, accuracy, MACs and params of every rung.

    python bench/edge_bench.py --model resnet50        (what `make bench` runs)

Writes bench/results/<model>-<timestamp>.json and .md and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def run(model: str, runs_dir: str, run_id: str) -> float:
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "pipeline", "run", model, "--run-id", run_id, "--runs-dir", runs_dir]
    subprocess.run(cmd, check=True)  # the environment as `make edge` gives it (OpenMP's wait policy recorded)
    return time.perf_counter() - started


def main() -> int:
    from bench.recipe_seeds import machine, provenance
    from pipeline.core.stage import STAGE_ORDER

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--run-id", help="finish an existing run instead of starting one; its first-run time is then "
                                         "the sum of the stage times recorded in its manifest")
    args = parser.parse_args()
    run_id = args.run_id or time.strftime("bench-%Y%m%d-%H%M%S")
    manifest_path = Path(args.runs_dir) / args.model / run_id / "manifest.json"
    first = run(args.model, args.runs_dir, run_id)
    # The first run's stage times, read before the re-run: deploy and report run again on it (reusing every
    # measurement) and record their re-run's seconds.
    stages = json.loads(manifest_path.read_text())["stages"]
    second = run(args.model, args.runs_dir, run_id)
    if args.run_id:
        first = sum(entry["seconds"] for entry in stages.values())
    rungs = stages["evaluate"]["metrics"]["rungs"]
    result = {
        "model": args.model, "date": time.strftime("%Y-%m-%d %H:%M"), "host": platform.node(),
        "cpus": os.cpu_count(), "torch": stages["teacher"]["env"]["torch"],
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or "default (unset)", "machine": machine(),
        "provenance": provenance(args.model),
        # Each training epoch's rate and precision, as the stages logged them.
        "training": {name: [{key: epoch.get(key) for key in ("epoch", "images_per_s", "autocast")}
                            for epoch in stages[name].get("metrics", {}).get("history", []) if "images_per_s" in epoch]
                     for name in ("teacher", "distill") if name in stages},
        "first_run_s": round(first, 1), "cached_rerun_s": round(second, 1),
        "stage_seconds": {name: stages[name]["seconds"] for name in STAGE_ORDER if name in stages},
        "rungs": rungs, "run": f"{Path(args.runs_dir).name}/{args.model}/{run_id}",  # read on other machines: no host path
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{args.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"## `make edge MODEL={args.model}` on {result['cpus']} CPUs, {result['date']} (torch {result['torch']})",
        "",
        f"First run {first / 60:.1f} min{' (sum of stage times)' if args.run_id else ''}, cached re-run {second:.1f} s.",
        "",
        f"Machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, {result['machine']['kernels']} "
        f"({', '.join(result['machine']['vector_flags'])}); OMP_WAIT_POLICY {result['omp_wait_policy']}. Training "
        "rate per epoch: " + "; ".join(f"{name} " + ", ".join(f"{e['images_per_s']:.0f}" for e in epochs) + " images/s"
                                       for name, epochs in result["training"].items() if epochs) + ".",
        "",
        "| stage | seconds |", "|---|---:|",
        *[f"| {name} | {seconds:.1f} |" for name, seconds in result["stage_seconds"].items()],
        "",
        "| rung | top-1 | Δ vs teacher (points) | GMACs | MACs vs teacher | params (M) | checkpoint (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[f"| {name} | {100 * r['top1']:.2f}% | {r['top1_delta_points']:+.2f} | {r['macs_g']:.3f} | "
          f"{100 * r['macs_fraction']:.1f}% | {r['params_m']:.2f} | {r['size_mb']:.1f} |" for name, r in rungs.items()],
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Distillation scaling with 1 and 2 gloo processes (torchrun, CPU), and the data path against the step.

    python bench/ddp_scaling.py [--model tiny] [--epochs 4]

Prepares one run through prune, then redoes only the distill stage under ``torchrun
--nproc_per_node=N`` for each N, in one sitting. Reports training images/s (all ranks together),
the speed-up over one process, and what the input pipeline alone delivers per process, which names
the bottleneck: a data path far faster than the step means compute bounds the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "EDGEFOLD_PROGRESS": "0", "EDGEFOLD_DEVICE": "cpu"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run([sys.executable, "-m", "pipeline", "run", args.model, "--until", "prune", "--runs-dir",
                        str(base), "--run-id", "bench"], cwd=REPO, env=env, check=True)
        for procs in args.procs:
            runs = Path(tmp) / f"p{procs}"
            shutil.copytree(base, runs, symlinks=True)
            # One intra-op thread per process: N processes share the same cores fairly.
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc_per_node={procs}", "-m", "pipeline", "run", args.model, "--until", "distill",
                            "--force", "distill", "--runs-dir", str(runs), "--run-id", "bench",
                            "--set", f"distill.train.epochs={args.epochs}"],
                           cwd=REPO, env={**env, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // procs))},
                           check=True)
            wall = time.perf_counter() - started
            manifest = json.loads((runs / args.model / "bench" / "manifest.json").read_text())
            history = manifest["stages"]["distill"]["metrics"]["history"][1:] or \
                manifest["stages"]["distill"]["metrics"]["history"]  # the first epoch warms caches up
            rows.append({"processes": procs, "train_images_per_s": statistics.median(h["images_per_s"] for h in history),
                         "data_images_per_s_per_process": statistics.median(h["data_images_per_s"] for h in history),
                         "data_wait_fraction": statistics.median(h["data_wait_fraction"] for h in history),
                         "stage_seconds": manifest["stages"]["distill"]["seconds"], "wall_s": wall,
                         "top1": manifest["stages"]["distill"]["metrics"]["top1"]})
    for row in rows:
        row["speedup"] = row["train_images_per_s"] / rows[0]["train_images_per_s"]
        row["bottleneck"] = "input" if row["data_wait_fraction"] > 0.3 else "compute"
    result = {"model": args.model, "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
              "epochs": args.epochs, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"ddp-scaling-{args.model}-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"{args.model} distillation, gloo on {os.cpu_count()} CPU cores, {result['date']}", "",
             "| processes | train img/s | speed-up | data path img/s per process | data wait | bottleneck | top-1 |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['processes']} | {row['train_images_per_s']:.0f} | ×{row['speedup']:.2f} | "
                     f"{row['data_images_per_s_per_process']:.0f} | {100 * row['data_wait_fraction']:.1f}% | "
                     f"{row['bottleneck']} | {100 * row['top1']:.2f}% |")
    (out / f"ddp-scaling-{args.model}-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

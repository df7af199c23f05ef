"""Telemetry overhead on this host: the same ONNX Runtime job with the samplers on and off, in one run.

    python bench/telemetry_overhead.py --onnx runs/resnet50/latest/quantize/student.int8.onnx

Alternates off/on jobs, swapping which goes first each repeat (so drift and ordering hit both alike), and reports latency p50 for each, their ratio,
the samplers' achieved rate against the requested one, and the latency CV over the repeated jobs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    from device.measure import MeasureSpec, measure
    from device.runners.onnxruntime import OnnxRuntimeRunner
    from device.telemetry.host import HostSampler

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate-hz", type=float, default=50.0)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    spec = MeasureSpec(warmup_iterations=20, iterations=args.iterations, idle_s=0.5)
    rows = {"off": [], "on": []}
    with OnnxRuntimeRunner(args.onnx) as runner:
        shape = runner.session.get_inputs()[0].shape
        batch = np.random.default_rng(0).standard_normal((args.batch, *shape[1:])).astype(np.float32)
        for repeat in range(args.repeats):
            # Alternate which goes first, so an ordering effect does not pose as overhead.
            for mode in (("off", "on") if repeat % 2 == 0 else ("on", "off")):
                if mode == "off":
                    rows["off"].append(measure(runner, batch, spec))
                    continue
                with HostSampler(rate_hz=args.rate_hz) as host:
                    rows["on"].append(measure(runner, batch, spec, [host]))
    p50 = {mode: float(np.median([r["latency_p50_ms"] for r in rs])) for mode, rs in rows.items()}
    achieved = [r["telemetry"]["host"]["achieved_hz"] for r in rows["on"]]
    result = {
        "onnx": args.onnx, "date": time.strftime("%Y-%m-%d %H:%M"), "batch": args.batch, "iterations": args.iterations,
        "repeats": args.repeats, "p50_off_ms": p50["off"], "p50_on_ms": p50["on"],
        "p50_on_over_off": p50["on"] / p50["off"], "requested_hz": args.rate_hz,
        "achieved_hz_median": float(np.median(achieved)),
        "p50_cv_across_jobs": {mode: float(np.std([r["latency_p50_ms"] for r in rs], ddof=1)
                                           / np.mean([r["latency_p50_ms"] for r in rs])) for mode, rs in rows.items()},
        "latency_cv_within_job_median": {mode: float(np.median([r["latency_cv"] for r in rs])) for mode, rs in rows.items()},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"telemetry-overhead-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

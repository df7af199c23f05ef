"""Telemetry overhead on this host: the same ONNX Runtime job with telemetry on and off, through a real agent.

    python bench/telemetry_overhead.py --onnx runs/resnet50/latest/quantize/student.int8.onnx

Starts a loopback agent and submits alternating jobs (host sampler at --rate-hz, or no telemetry),
swapping which goes first each repeat so drift and ordering hit both alike. Reports latency p50 of
each mode, their ratio, the sampler's achieved rate against the requested one, and the latency CV
of p50 over the repeated jobs of each mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    from device.service.loopback import LoopbackAgent

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate-hz", type=float, default=50.0)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    job = {"batch_sizes": [args.batch], "iterations": args.iterations, "warmup_iterations": 20, "idle_s": 0.5,
           "sample_hz": args.rate_hz, "label": "telemetry-overhead"}
    rows: dict[str, list[dict]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp, LoopbackAgent(Path(tmp) / "agent") as agent, agent.client() as client:
        sha = client.upload(args.onnx)
        for repeat in range(args.repeats):
            for mode in (("off", "on") if repeat % 2 == 0 else ("on", "off")):
                spec = {**job, "artifact": sha, "telemetry": ["host"] if mode == "on" else []}
                done = client.wait(client.submit(spec)["id"], timeout_s=600)
                if done["state"] != "succeeded":
                    raise SystemExit(f"job failed: {done['error']}")
                rows[mode].append(done["result"]["runs"][0])
                print(f"repeat {repeat + 1}/{args.repeats} {mode:3s} p50 {rows[mode][-1]['latency_p50_ms']:.3f} ms",
                      file=sys.stderr)
    p50 = {mode: [r["latency_p50_ms"] for r in rs] for mode, rs in rows.items()}
    achieved = [r["telemetry"]["host"]["achieved_hz"] for r in rows["on"]]
    result = {
        "onnx": args.onnx, "date": time.strftime("%Y-%m-%d %H:%M"), "through": "loopback agent, one job per child",
        "batch": args.batch, "iterations": args.iterations, "repeats": args.repeats,
        "p50_off_ms": float(np.median(p50["off"])), "p50_on_ms": float(np.median(p50["on"])),
        "p50_on_over_off": float(np.median(p50["on"]) / np.median(p50["off"])), "requested_hz": args.rate_hz,
        "achieved_hz_median": float(np.median(achieved)),
        "p50_cv_across_jobs": {mode: float(np.std(v, ddof=1) / np.mean(v)) for mode, v in p50.items()},
        "latency_cv_within_job_median": {mode: float(np.median([r["latency_cv"] for r in rs]))
                                         for mode, rs in rows.items()},
        "p50_ms_per_job": p50,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"telemetry-overhead-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

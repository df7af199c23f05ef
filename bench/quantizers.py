"""ModelOpt against ONNX Runtime on one run's FP32 student: INT8 top-1, drop, size and time.

    python bench/quantizers.py --run runs/resnet50/latest

Works on a copy of the run directory (the run itself is not changed). Each quantizer is timed
over its whole quantize stage: calibration, Q/DQ insertion, the TensorRT lint and the INT8
evaluation on the test split.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def checkout_relative(path: Path) -> str:
    """A path as recorded in results: relative to the checkout, never this machine's absolute path."""
    try:
        return str(Path(path).resolve().relative_to(HERE.parent))
    except ValueError:
        return Path(path).name
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    from device.errors import EdgeFoldError
    from pipeline.runner import run_pipeline

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a run directory with its export stage done")
    parser.add_argument("--methods", default="max,entropy")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    source = Path(args.run).resolve()
    manifest = json.loads((source / "manifest.json").read_text())
    model, rows = manifest["model"], []
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        shutil.copytree(source, runs / model / "bench")
        for quantizer in ("modelopt", "ort"):
            for method in args.methods.split(","):
                started = time.perf_counter()
                try:
                    ctx = run_pipeline(manifest["recipe"]["path"], runs_dir=runs, run_id="bench", until="quantize",
                                       force=["quantize"], overrides={"quantize.quantizer": quantizer,
                                                                      "quantize.calibration_methods": [method],
                                                                      "quantize.accuracy_budget_points": 100.0})
                except EdgeFoldError as err:  # a method this quantizer lacks
                    print(f"{quantizer}/{method}: {err.message}", file=sys.stderr)
                    continue
                seconds = time.perf_counter() - started
                m = ctx.manifest.stage("quantize")["metrics"]
                attempt = m["attempts"][0]
                rows.append({"quantizer": quantizer, "method": method, "fp32_top1": m["fp32_top1"], "top1": m["top1"],
                             "drop_points": m["drop_points"], "size_mb": m["size_mb"], "fp32_size_mb": m["fp32_size_mb"],
                             "float_layers": attempt["lint"]["float_layers"], "qdq_pairs": attempt["lint"]["qdq_pairs"],
                             "seconds": round(seconds, 1)})
    lines = [f"## INT8 quantizers on `{checkout_relative(source)}` ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"FP32 student: top-1 {100 * rows[0]['fp32_top1']:.2f}%, {rows[0]['fp32_size_mb']:.1f} MB", "",
             "| quantizer | calibration | INT8 top-1 | drop (points) | size MB | size vs FP32 | Q/DQ pairs | float layers | seconds |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['quantizer']} | {r['method']} | {100 * r['top1']:.2f}% | {r['drop_points']:+.2f} | "
                     f"{r['size_mb']:.1f} | {100 * r['size_mb'] / r['fp32_size_mb']:.0f}% | {r['qdq_pairs']} | "
                     f"{', '.join(r['float_layers']) or '-'} | {r['seconds']:.0f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"quantizers-{model}-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Data-center baseline: the ResNet-50 teacher through the agent's Torch runner with NVML telemetry.

    bash bench/dc_baseline.sh            # on a GPU machine with torch and nvidia-ml-py

Exports torchvision's ResNet-50 with ``torch.export`` (random weights: latency and power do not
depend on the weights' values) at the recipe's input (3×32×32, 10 classes) and at ImageNet's
(3×224×224, 1000 classes), starts a loopback agent, and measures each at batch 1 (CUDA graphs) and at
a throughput batch, in fp32 and fp16, channels_last. Writes ``bench/results/dc-baseline-*.json``
and a Markdown table for the README's data-center section.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def export(path: Path, size: int, classes: int) -> Path:
    import torch
    import torchvision

    model = torchvision.models.resnet50(num_classes=classes).eval()
    example = torch.randn(2, 3, size, size)
    program = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1024)},))
    torch.export.save(program, path)
    return path


def main() -> int:
    import torch

    from device.loopback import LoopbackAgent

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 224], help="input sides to measure")
    parser.add_argument("--throughput-batch", type=int, default=256)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--duration-s", type=float, default=8.0, help="timed window per job and batch size")
    parser.add_argument("--idle-s", type=float, default=2.0, help="idle power baseline before each job")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a plumbing check, no baseline)")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        raise SystemExit("no CUDA GPU here: the data-center baseline needs one (--allow-cpu checks the plumbing only)")
    rows, jobs = [], []
    with tempfile.TemporaryDirectory() as tmp, LoopbackAgent(Path(tmp) / "agent") as agent, \
            agent.client(timeout_s=120) as client:
        device = client.device()
        for size in args.sizes:
            classes = 10 if size == 32 else 1000
            artifact = client.upload(export(Path(tmp) / f"resnet50-{size}.pt2", size, classes))
            for precision in args.precisions:
                spec = {"artifact": artifact, "runtime": "torch", "precision": precision, "channels_last": True,
                        "cuda_graphs": cuda, "batch_sizes": [1, args.throughput_batch], "duration_s": args.duration_s,
                        "warmup_iterations": 20, "idle_s": args.idle_s,
                        "telemetry": ["nvml", "host"] if cuda else ["host"],
                        "sample_hz": 50, "label": f"dc-baseline resnet50 {size}px {precision}", "timeout_s": 1200}
                job = client.wait(client.submit(spec)["id"], timeout_s=1500)
                jobs.append(job)
                print(f"{spec['label']}: {job['state']} {job['error'] or ''}", file=sys.stderr)
                if job["state"] != "succeeded":
                    continue
                for run in job["result"]["runs"]:
                    summary = run["summary"]
                    energy = summary["energy_mj_per_image"]
                    rows.append({"input": f"3×{size}×{size}", "precision": precision, "batch": run["batch_size"],
                                 "p50_ms": run["latency_p50_ms"], "p99_ms": run["latency_p99_ms"],
                                 "images_per_s": run["throughput_images_per_s"],
                                 "power_mean_w": summary["power_mean_mw"] / 1e3 if summary["power_mean_mw"] else None,
                                 "energy_mj_per_image": energy, "peak_memory_mb": summary["peak_memory_mb"]})
    stamp = time.strftime("%Y%m%d-%H%M%S")
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "gpu": device.get("gpu"), "cuda": device.get("cuda"),
              "torch": device.get("torch"), "device": device, "rows": rows,
              "jobs": [{k: j[k] for k in ("id", "state", "error")} for j in jobs]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"dc-baseline-{stamp}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")

    def cell(value, fmt):
        return "not measured" if value is None else format(value, fmt)

    table = [f"ResNet-50 (torch.export, Torch runner, channels_last{', CUDA graphs' if cuda else ''}) on "
             f"{result['gpu']}, CUDA {result['cuda']}, torch {result['torch']}, {result['date']}", "",
             "| input | precision | batch | p50 ms | p99 ms | images/s | mean power W | energy mJ/image |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        table.append(f"| {row['input']} | {row['precision']} | {row['batch']} | {row['p50_ms']:.3f} | "
                     f"{row['p99_ms']:.3f} | {row['images_per_s']:.0f} | {cell(row['power_mean_w'], '.1f')} | "
                     f"{cell(row['energy_mj_per_image'], '.2f')} |")
    (out / f"dc-baseline-{stamp}.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0 if rows and all(j["state"] == "succeeded" for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())

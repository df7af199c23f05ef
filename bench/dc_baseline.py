"""Data-center baseline: the ResNet-50 teacher through the agent on each road to TensorRT, with NVML telemetry.

    bash bench/dc_baseline.sh            # on a GPU machine with torch and nvidia-ml-py

Writes torchvision's ResNet-50 as a device checkpoint (random weights: latency and power do not depend on the
weights' values; the agent rebuilds the module from its own registry, as a default agent does) at the recipe's input
(3×32×32, 10 classes) and at ImageNet's (3×224×224, 1000 classes), starts a loopback agent, and measures each at
batch 1 and at a throughput batch, in fp32 and fp16, on each road (``--roads``):

* ``torch``: the agent's Torch runner (channels_last, CUDA graphs at batch 1 on a GPU);
* ``torch_tensorrt``: the same checkpoint exported and compiled on the agent by Torch-TensorRT (the PyTorch user's
  road);
* ``tensorrt``: the ONNX road, the model exported to ONNX (FP16 written in the graph for fp16) and built by the
  agent's TensorRT runner.

A road whose library does not import here is not measured, and the output says so with the reason on its own
line (and in the JSON's ``roads``), never silently. Rows of one input, precision and batch sit side by side.
Writes ``bench/results/dc-baseline-*.json`` and a Markdown table for the README's data-center section.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

ROADS = ("torch", "torch_tensorrt", "tensorrt")
ROAD_LABELS = {"torch": "Torch", "torch_tensorrt": "Torch-TensorRT", "tensorrt": "ONNX → TensorRT"}
ROAD_MODULES = {"torch": "torch", "torch_tensorrt": "torch_tensorrt", "tensorrt": "tensorrt"}
ROAD_FIXES = {"torch_tensorrt": "on a GPU host: pip install 'edgefold[torch-tensorrt]' next to the TensorRT its "
                                "release requires (docker/dc.Dockerfile WITH_TORCH_TENSORRT=1)",
              "tensorrt": "on a GPU host: NVIDIA's TensorRT container (docker/dc.Dockerfile) or pip install tensorrt",
              "torch": "pip install torch"}


def road_status(road: str) -> dict[str, Any]:
    """Whether this host can measure ``road``: ``{"measured": True, "version": …}`` or ``{"measured": False,
    "reason": …}`` (the import's own error: a missing package and a package whose libraries are missing differ).

    The loopback agent runs this same Python, so what imports here imports in its job processes.
    """
    module = ROAD_MODULES[road]
    try:
        imported = importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 (ImportError, or OSError for a missing libnvinfer: both mean "not here")
        first = str(err).splitlines()[0] if str(err) else ""
        return {"measured": False,
                "reason": f"{module} does not import here ({type(err).__name__}: {first}); fix: {ROAD_FIXES[road]}"}
    return {"measured": True, "version": getattr(imported, "__version__", "unknown")}


def road_line(road: str, status: dict[str, Any]) -> str:
    """The output line for a road: measured with which version, or not measured and why."""
    if status["measured"]:
        return f"road {road} ({ROAD_LABELS[road]}): measured with {ROAD_MODULES[road]} {status['version']}"
    return f"road {road} ({ROAD_LABELS[road]}): NOT MEASURED: {status['reason']}"


def export(path: Path, size: int, classes: int, arch: str = "resnet50") -> Path:
    """The architecture's device checkpoint (``<path>.device.pt``): what the agent rebuilds and runs."""
    import torch

    from pipeline.checkpoint import save_checkpoint
    from pipeline.models import build_model
    from pipeline.tasks.classification.torch_export import write_device_checkpoint

    torch.manual_seed(0)
    checkpoint = save_checkpoint(path.with_suffix(".pt"), build_model(arch, classes).eval(), arch, classes)
    return write_device_checkpoint(checkpoint, path.with_suffix(".device.pt"), (3, size, size))


def export_onnx(folder: Path, size: int, classes: int,
                arch: str = "resnet50") -> tuple[dict[str, Path], dict[str, str]]:
    """The ONNX road's artifacts: FP32, and FP16 written in the graph (TensorRT builds what the graph says).

    Returns:
        (artifact per precision, why a precision has none): the FP16 conversion needs the ``modelopt`` extra's
        converters, which a data-center agent may lack; that precision is then reported, not measured.
    """
    import torch
    import torchvision

    from pipeline.export.onnx import export_onnx as export_graph

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(num_classes=classes).eval()
    fp32 = folder / f"{arch}-{size}.onnx"
    export_graph(model, fp32, (1, 3, size, size), opset=17)
    fp16 = folder / f"{arch}-{size}.fp16.onnx"
    try:
        from pipeline.quantize.fp16 import to_fp16

        to_fp16(fp32, fp16)
    except Exception as err:  # noqa: BLE001 (a missing converter or a failed conversion: both leave no FP16 model)
        return {"fp32": fp32}, {"fp16": f"no FP16 ONNX ({type(err).__name__}: {str(err).splitlines()[0]})"}
    return {"fp32": fp32, "fp16": fp16}, {}


def job_spec(road: str, artifact: str, precision: str, size: int, args, cuda: bool) -> dict[str, Any]:
    spec = {"artifact": artifact, "runtime": road, "precision": precision,
            "batch_sizes": [1, args.throughput_batch], "duration_s": args.duration_s, "warmup_iterations": 20,
            "idle_s": args.idle_s, "telemetry": ["nvml", "host"] if cuda else ["host"], "sample_hz": 50,
            "profile": args.profile and road != "torch",
            "label": f"dc-baseline {args.arch} {size}px {precision} {road}", "timeout_s": 1200}
    if road == "torch":  # the Torch runner's own options
        spec.update(channels_last=True, cuda_graphs=cuda)
    return spec


def rows_of(job: dict[str, Any], road: str, size: int, precision: str) -> list[dict[str, Any]]:
    result = job["result"]
    fell_back = (result["runtime"].get("torch_tensorrt") or {}).get("fallback_count")
    rows = []
    for run in result["runs"]:
        summary = run["summary"]
        rows.append({"road": road, "input": f"3×{size}×{size}", "precision": precision, "batch": run["batch_size"],
                     "p50_ms": run["latency_p50_ms"], "p99_ms": run["latency_p99_ms"],
                     "images_per_s": run["throughput_images_per_s"],
                     "power_mean_w": summary["power_mean_mw"] / 1e3 if summary["power_mean_mw"] else None,
                     "energy_mj_per_image": summary["energy_mj_per_image"], "peak_memory_mb": summary["peak_memory_mb"],
                     "fallback_ops": fell_back, "profiled": result.get("profile") is not None})
    return rows


def table(result: dict[str, Any], cuda: bool) -> list[str]:
    """The Markdown: one line per road (measured or why not), then the rows, roads side by side."""

    def cell(value, fmt):
        return "not measured" if value is None else format(value, fmt)

    lines = [f"{result['arch']} (device checkpoint) on {result['gpu']}, CUDA {result['cuda']}, torch {result['torch']}, "
             f"{result['date']}{' (CUDA graphs on the Torch road)' if cuda else ''}", ""]
    lines += [f"- {road_line(road, status)}" for road, status in result["roads"].items()]
    lines += [f"- NOT MEASURED: {what}" for what in result.get("not_measured", [])]
    lines += ["", "| road | input | precision | batch | p50 ms | p99 ms | images/s | mean power W | energy mJ/image | "
                  "p50 vs Torch |", "|---|---|---|---|---|---|---|---|---|---|"]
    order = {road: index for index, road in enumerate(ROADS)}
    rows = sorted(result["rows"], key=lambda r: (r["input"], r["precision"], r["batch"], order[r["road"]]))
    for row in rows:
        torch_row = next((r for r in rows if r["road"] == "torch" and all(r[k] == row[k] for k in
                                                                          ("input", "precision", "batch"))), None)
        ratio = f"{row['p50_ms'] / torch_row['p50_ms']:.2f}×" if torch_row and row["road"] != "torch" else ""
        lines.append(f"| {ROAD_LABELS[row['road']]} | {row['input']} | {row['precision']} | {row['batch']} | "
                     f"{row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['images_per_s']:.0f} | "
                     f"{cell(row['power_mean_w'], '.1f')} | {cell(row['energy_mj_per_image'], '.2f')} | {ratio} |")
    return lines


def main() -> int:
    import torch

    from device.service.loopback import LoopbackAgent

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 224], help="input sides to measure")
    parser.add_argument("--throughput-batch", type=int, default=256)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--roads", nargs="+", choices=ROADS, default=list(ROADS),
                        help="roads to TensorRT to measure (one whose library does not import is reported, not run)")
    parser.add_argument("--duration-s", type=float, default=8.0, help="timed window per job and batch size")
    parser.add_argument("--idle-s", type=float, default=2.0, help="idle power baseline before each job")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the per-layer profile of the TensorRT roads")
    parser.add_argument("--arch", choices=["resnet50", "resnet18"], default="resnet50",
                        help="the teacher (resnet50); resnet18 for a quicker plumbing check")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a plumbing check, no baseline)")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        raise SystemExit("no CUDA GPU here: the data-center baseline needs one (--allow-cpu checks the plumbing only)")
    roads = {road: road_status(road) for road in args.roads}
    for road, status in roads.items():
        print(road_line(road, status), file=sys.stderr, flush=True)
    rows, jobs, skipped = [], [], []
    with tempfile.TemporaryDirectory() as tmp, LoopbackAgent(Path(tmp) / "agent") as agent, \
            agent.client(timeout_s=120) as client:
        device = client.device()
        for size in args.sizes:
            classes = 10 if size == 32 else 1000
            program = client.upload(export(Path(tmp) / f"{args.arch}-{size}", size, classes, args.arch))
            onnx, missing = {}, {}
            if roads.get("tensorrt", {}).get("measured"):
                paths, missing = export_onnx(Path(tmp), size, classes, args.arch)
                onnx = {p: client.upload(path) for p, path in paths.items()}
            for precision in args.precisions:
                for road in (r for r in args.roads if roads[r]["measured"]):
                    if road == "tensorrt" and precision not in onnx:
                        skipped.append(f"{road} {size}px {precision}: {missing.get(precision, 'no ONNX model')}")
                        print(f"NOT MEASURED: {skipped[-1]}", file=sys.stderr)
                        continue
                    artifact = onnx[precision] if road == "tensorrt" else program
                    spec = job_spec(road, artifact, precision, size, args, cuda)
                    job = client.wait(client.submit(spec)["id"], timeout_s=1500)
                    jobs.append(job)
                    print(f"{spec['label']}: {job['state']} {job['error'] or ''}", file=sys.stderr, flush=True)
                    if job["state"] == "succeeded":
                        rows.extend(rows_of(job, road, size, precision))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "arch": args.arch, "gpu": device.get("gpu"),
              "cuda": device.get("cuda"),
              "torch": device.get("torch"), "torch_tensorrt": device.get("torch_tensorrt"),
              "tensorrt": device.get("tensorrt"), "device": device, "roads": roads, "rows": rows,
              "not_measured": skipped,
              "jobs": [{k: j[k] for k in ("id", "state", "error")} for j in jobs]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"dc-baseline-{stamp}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    lines = table(result, cuda)
    (out / f"dc-baseline-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if rows and all(j["state"] == "succeeded" for j in jobs) else 1


if __name__ == "__main__":
    sys.exit(main())

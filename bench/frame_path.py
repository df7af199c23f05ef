"""From camera frame to answer at 1080p on this CPU: where the frame's time goes for the ResNet-50 recipe's student.

    python bench/frame_path.py                 # writes bench/results/frame-path-<date>.{json,md}

Goal, stated before the run: for the ResNet-50 recipe's student (ResNet-50 pruned to 24% of its MACs by the recipe's
own prune settings, at its 32×32 input), a 1920×1080 frame in each format a Jetson camera application meets (BGR from
a camera, NV12 from a hardware decoder, JPEG from an MJPEG stream), measure the share of the frame's time spent
outside the network, the pipelined frame rate (decode + preprocess in a thread of their own) against the sequential
one, and the preprocessing written into the graph (:mod:`pipeline.deploy.frame_prefix`) against the CPU path, each with its
95% interval over the rounds; report every run, the machine and the versions.

Timing does not depend on the weights, so the student is pruned from an untrained ResNet-50 (no teacher is trained):
the network's shape and MACs are the recipe's. The path is the agent's own (:func:`device.jobs.frame.time_frames`) on an ONNX
Runtime runner in this process, the runner the loopback agent uses here; the in-graph form is the same student with
the prefix in front, on a runner of its own, timed in the same rounds, interleaved (as the agent does).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

GOAL = ("at 1920×1080, for the ResNet-50 recipe's student, the share of the frame's time outside the network, "
        "the pipelined frame rate against the sequential one, and the preprocessing in the graph against the CPU "
        "path, per frame format (bgr, nv12, jpeg), with 95% intervals over rounds; every run reported")


def student_onnx(path: Path) -> tuple[Path, dict]:
    """The resnet50 recipe's student shape: an untrained ResNet-50 pruned by the recipe's prune section."""
    import torch

    from pipeline.core.recipe import load_recipe
    from pipeline.models import build_model, count_macs
    from pipeline.export.onnx import export_onnx
    from pipeline.prune.ratio import find_plan, make_pruner

    recipe, _, _ = load_recipe("resnet50")
    shape = recipe.preprocess.to_preprocess().input_shape(1)
    torch.manual_seed(0)
    model = build_model("resnet50", 10, 3).eval()
    base = count_macs(model, shape)
    plan, _ = find_plan(model, "resnet50", recipe.prune, shape, base)
    pruner = make_pruner(model, "resnet50", recipe.prune, plan, shape)
    for _ in range(recipe.prune.steps):
        pruner.step()
    export_onnx(model.eval(), path, shape, recipe.export.opset)
    return path, {"macs_fraction": count_macs(model, shape) / base, "input": list(shape),
                  "preprocess": recipe.preprocess.to_preprocess().to_dict()}


def measured_run(runner, preprocess, spec, graph_runner) -> dict:
    """One format's frames through the agent's own path, both forms, with each figure's median and 95% interval over
    rounds."""
    from device.jobs.frame import time_frames
    from pipeline import stats

    started = time.perf_counter()
    measured = time_frames(runner, preprocess, spec, progress=lambda text: print(f"  {spec.format}: {text}", flush=True),
                           graph_runner=graph_runner)
    stages = {s["stage"]: s["round_medians_ms"] for s in measured["stages"]}
    total = measured["total"]["round_medians_ms"]
    outside = [1 - engine / whole for engine, whole in zip(stages["engine"], total)]
    return {"seconds": time.perf_counter() - started, "result": measured,
            "parts_ms": {name: stats.median_interval(values) for name, values in stages.items()},
            "total_ms": stats.median_interval(total), "outside_share": stats.median_interval(outside),
            "sequential_fps": stats.median_interval(measured["sequential_fps_rounds"]),
            "pipelined_fps": stats.median_interval(measured["pipelined_fps_rounds"]),
            "pipelined_over_sequential": stats.ratio_interval(measured["pipelined_fps_rounds"],
                                                              measured["sequential_fps_rounds"]),
            "in_graph_total_ms": stats.median_interval(measured["in_graph"]["total"]["round_medians_ms"]),
            "cpu_over_in_graph": stats.ratio_interval(total, measured["in_graph"]["total"]["round_medians_ms"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=24, help="frames per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", default="0,1", help="ONNX Runtime intra-op threads to run with, comma-separated "
                                                         "(0: its default, every core)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    print(f"goal: {GOAL}", flush=True)

    import onnxruntime

    from bench.recipe_seeds import machine
    from device.jobs.frame_schema import FRAME_STAGES, FrameSpec
    from device.preprocess import Preprocess
    from device.runners import make_runner
    from pipeline.deploy.frame_prefix import write_prefixed

    work = Path("/tmp/edgefold-frame-bench")
    work.mkdir(exist_ok=True)
    onnx_path, student = student_onnx(work / "student.onnx")
    preprocess = Preprocess.from_dict(student["preprocess"])
    runs = []
    for threads in (int(t) for t in args.threads.split(",")):
        with make_runner("onnxruntime", str(onnx_path), threads=threads) as runner:
            for fmt in ("bgr", "nv12", "jpeg"):
                spec = FrameSpec(width=1920, height=1080, format=fmt, frames=args.frames, rounds=args.rounds)
                prefixed = write_prefixed(onnx_path, preprocess, spec, work / f"student-{fmt}.onnx")
                with make_runner("onnxruntime", str(prefixed), threads=threads) as graph_runner:
                    runs.append({"format": fmt, "threads": threads,
                                 **measured_run(runner, preprocess, spec, graph_runner)})
                print(f"  {fmt}, {threads or 'default'} threads: {runs[-1]['result']['bound_text']}", flush=True)
    host = machine()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    document = {"goal": GOAL, "machine": host, "onnxruntime": onnxruntime.__version__, "student": student,
                "frames_per_round": args.frames, "rounds": args.rounds, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"frame-path-{stamp}.json").write_text(json.dumps(document, indent=1) + "\n")

    def cell(triple, spec=".2f", scale=1.0):
        return f"{format(triple[0] * scale, spec)} [{format(triple[1] * scale, spec)}, {format(triple[2] * scale, spec)}]"

    lines = [f"# The frame's path at 1080p: {time.strftime('%Y-%m-%d')}", "", f"Goal (stated before the run): {GOAL}.", "",
             f"Machine: {host['cpu']} ({host['kernels']}; {', '.join(host['vector_flags'])}), {host['cores']} cores; "
             f"ONNX Runtime {onnxruntime.__version__} on CPU. The student: ResNet-50 pruned to "
             f"{100 * student['macs_fraction']:.1f}% of its MACs (untrained: timing does not depend on weights), "
             f"input {student['input']}. {args.rounds} rounds of {args.frames} frames per format; medians with 95% "
             "bootstrap intervals over the rounds.", "",
             "| frame | engine threads | " + " | ".join(f"{p} ms" for p in FRAME_STAGES) + " | total ms | outside the network | "
             "fps, one by one | fps, pipelined | pipelined / one by one | what bounds it | total ms, in the graph | "
             "CPU path / in the graph |",
             "|---|---|" + "---|" * (len(FRAME_STAGES) + 8)]
    for run in runs:
        lines.append(f"| 1920×1080 {run['format']} | {run['threads'] or 'default'} | " + " | ".join(cell(run["parts_ms"][p]) for p in FRAME_STAGES)
                     + f" | {cell(run['total_ms'])} | {cell(run['outside_share'], '.1f', 100)}% | "
                     f"{cell(run['sequential_fps'], '.1f')} | {cell(run['pipelined_fps'], '.1f')} | "
                     f"{cell(run['pipelined_over_sequential'])} | {run['result']['bound_text']} | "
                     f"{cell(run['in_graph_total_ms'])} | {cell(run['cpu_over_in_graph'])} |")
    (args.out / f"frame-path-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does the sensitivity order regain INT8 accuracy with fewer layers kept out of INT8 than the largest or random ones?

    python bench/int8_sensitivity.py --runs /tmp/edgefold-seeds-resnet50/runs/resnet50/seed{0,1,2} \
        --outlier 1000 --budget 0.3 --ks 0,1,2,4,8 --name resnet50
    python bench/int8_sensitivity.py --runs runs/tiny-det/seed{0,1,2} --quantizer modelopt --outlier 1000

Goal, stated before the run: on each finished run's FP32 student (export stage), the sensitivity order of
:mod:`pipeline.quantize.mixed_precision` (leave-one-out on calibration images held apart from calibration) brings the
INT8 student within the accuracy budget with at most half the layers kept out of INT8 that keeping the largest layers
(by MACs) or a random order needs. Each order is walked over the same k, each candidate written by the quantizer with
``nodes_to_exclude`` and calibrated on the same images, and scored on the test split — measurement only: the
sensitivity is measured on the held-out calibration slice, nothing is chosen on the test split. The random order is
one seeded permutation per run.

These students lose almost nothing to INT8 (ResNet-50 on Fashion-MNIST: 0.15 points per tensor, 0.07 calibrated on
four images), so there is nothing to regain as shipped. ``--outlier F`` plants the mechanism of real INT8 collapses —
one activation channel F times the rest, the function kept (:func:`plant_outlier`) — at a seeded place, and
``--budget`` sets a budget the planted candidate misses. ``--per-tensor`` and ``--calibration-images`` make INT8
harder another way. Every run is reported with the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

GOAL = ("the sensitivity order meets the accuracy budget with at most half the layers kept out of INT8 that the "
        "largest-layers or a random order needs")
KS = (0, 1, 2, 3, 4, 6, 8, 12, 16)


def one_run(run_dir: Path, method: str, per_tensor: bool, held_out: float, ks: tuple[int, ...],
            quantizer: str | None = None, calibration_images: int | None = None,
            outlier: float | None = None, budget: float | None = None,
            plant_in: str = "first-half") -> dict[str, Any]:
    """The three orders' accuracy over k on one run's student."""
    import numpy as np
    import onnx

    from pipeline.core.context import RunContext
    from pipeline.core.manifest import Manifest
    from pipeline.core.recipe import load_recipe
    from pipeline.quantize.mixed_precision import layer_macs, sensitivity
    from pipeline.quantize.ladder import HeldOut, Step, scratch_copy
    from pipeline.tasks.classification.int8 import ClassificationLadder
    from pipeline.tasks.detection.int8 import DetectionLadder

    manifest = json.loads((run_dir / "manifest.json").read_text())
    task_name = manifest.get("task", "classification")
    overrides = {**manifest.get("overrides", {}), "quantize.per_channel": not per_tensor,
                 "quantize.calibration_methods": [method], **({"quantize.quantizer": quantizer} if quantizer else {}),
                 **({"quantize.accuracy_budget_points": budget} if budget is not None else {})}
    if task_name == "detection":
        overrides["quantize.resamples"] = 10  # the intervals are not read here; the bootstrap is most of the time
    recipe, _, _ = load_recipe(manifest["recipe"]["path"], overrides)
    ctx = RunContext(recipe, Manifest.load(run_dir))
    ladder = {"classification": ClassificationLadder, "detection": DetectionLadder}[task_name]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="int8-sensitivity-") as scratch:
        work = Path(scratch)
        with scratch_copy(work, ctx.manifest.output("export", "student"), "student.onnx") as fp32:
            seed = int(manifest.get("overrides", {}).get("data.seed", 0))
            planted = plant_outlier(fp32, seed, outlier, plant_in) if outlier else None
            task = ladder.from_run(ctx, work, fp32)
            step = Step(recipe.quantize.quantizer, method)
            held = task.hold_out(held_out)
            if calibration_images:  # fewer calibration images: a harder INT8 (ranges from a small sample)
                held = HeldOut(held.calibration[:calibration_images], held.inputs, held.score)
            ranked_on = work / "ranked.onnx"
            task.quantize(step, ranked_on, calibration=held.calibration, float32_islands=True)
            float_model = onnx.load(str(fp32))
            distortion, ranking = sensitivity(onnx.load(str(ranked_on)), float_model, held.inputs, task.input_name,
                                              task.distortion)
            macs = layer_macs(float_model)
            total = sum(macs.values()) or 1
            layers = [layer.layer for layer in ranking]
            rng = np.random.default_rng(seed)
            orders = {"sensitivity": layers, "largest": sorted(layers, key=lambda name: (-macs.get(name, 0), name)),
                      "random": [layers[i] for i in rng.permutation(len(layers))]}
            reference = task.reference()
            measured: dict[frozenset, dict[str, Any]] = {}
            curves: dict[str, list[dict[str, Any]]] = {}
            for order, names in orders.items():
                curve = []
                for k in (k for k in ks if k <= len(names)):
                    kept = frozenset(names[:k])
                    if kept not in measured:
                        path = work / f"{order}.k{k}.onnx"
                        task.quantize(step, path, exclude=names[:k], calibration=held.calibration)
                        scores = task.score(path, Step(step.quantizer, f"{order}{k}"))
                        measured[kept] = {"value": scores["value"], "drop_points": task.drop_points(reference, scores),
                                          "within": task.within(reference, scores),
                                          "kept_macs_fraction": sum(macs.get(n, 0) for n in kept) / total}
                        path.unlink()
                    curve.append({"k": k, **measured[kept]})
                    print(f"  {run_dir.name} {order:11s} k={k:2d}: drop {measured[kept]['drop_points']:+.2f} points, "
                          f"{100 * measured[kept]['kept_macs_fraction']:.1f}% of MACs in FP16", flush=True)
                curves[order] = curve
    needed = {order: next((p["k"] for p in curve if p["within"]), None) for order, curve in curves.items()}
    # The run as recipe/run-id: results are read on other machines.
    return {"run": f"runs/{run_dir.parent.name}/{run_dir.name}", "task": task_name, "overrides": manifest.get("overrides", {}), "planted": planted,
            "fp32": reference["value"], "budget_points": recipe.quantize.accuracy_budget_points,
            "quantized_layers": len(layers), "candidate_distortion": distortion,
            "sensitivity_top": [layer.to_dict() for layer in ranking[:8]], "curves": curves, "layers_needed": needed,
            "goal_met": goal_met(needed), "seconds": round(time.perf_counter() - started, 1)}


def plant_outlier(path: Path, seed: int, factor: float, where: str = "first-half") -> dict[str, Any]:
    """Rewrites the FP32 ONNX at ``path`` with one outlier channel, the function kept: in a seeded choice of a
    Conv → Relu → Conv chain, channel c of the first convolution (weight and bias) is multiplied by ``factor`` and
    the second's input channel c divided by it (ReLU is positively homogeneous). The mechanism of real INT8
    collapses — one channel whose range sets a per-tensor scale that flattens the rest (BatchNorm folded over a
    tiny variance, an unbounded activation) — at a known place. Returns where.

    Args:
        where: ``first-half``: a chain in the first half of the network (where the maps are large); ``not-largest``:
            any chain whose consumer is not the network's largest layer by MACs (on a network with few chains the
            first half may hold only the largest layer, and then the largest-layers order finds the plant by size).
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    chains = []
    for first in (n for n in graph.node if n.op_type == "Conv" and len(n.input) == 3):
        relus = readers.get(first.output[0], [])
        if len(relus) != 1 or relus[0].op_type != "Relu":
            continue
        seconds = readers.get(relus[0].output[0], [])
        if len(seconds) == 1 and seconds[0].op_type == "Conv" and seconds[0].input[1] in weights:
            group = next((a.i for a in seconds[0].attribute if a.name == "group"), 1)
            if group == 1:
                chains.append((first, seconds[0]))
    if not chains:
        raise SystemExit(f"{path}: no Conv → Relu → Conv chain to plant an outlier in")
    rng = np.random.default_rng(seed)
    if where == "not-largest":
        from pipeline.quantize.mixed_precision import layer_macs

        macs = layer_macs(model)
        largest = max(macs, key=macs.get)
        chains = [chain for chain in chains if chain[1].name != largest] or chains
        first, second = chains[int(rng.integers(len(chains)))]
    else:
        # In the first half of the network (where the spatial maps are large).
        first, second = chains[int(rng.integers(max(1, len(chains) // 2)))]
    # On the channel with the largest folded bias: one that is active after the ReLU, so the outlier is there on
    # most images.
    values = {name: numpy_helper.to_array(weights[name]).copy() for name in (first.input[1], first.input[2],
                                                                              second.input[1])}
    channel = int(np.argmax(values[first.input[2]]))
    values[first.input[1]][channel] *= factor
    values[first.input[2]][channel] *= factor
    values[second.input[1]][:, channel] /= factor
    for name, value in values.items():
        weights[name].CopyFrom(numpy_helper.from_array(value, name))
    onnx.save(model, str(path))
    return {"first": first.name, "second": second.name, "channel": channel, "factor": factor,
            "chains": len(chains), "where": where}


def goal_met(needed: dict[str, int | None]) -> bool | None:
    """Sensitivity's k ≤ half of each alternative's (an order that never met the budget within the k tried counts
    as needing more than the largest k); None when even everything-INT8 met it (nothing to regain)."""
    if any(curve == 0 for curve in needed.values()):
        return None
    if needed["sensitivity"] is None:
        return False
    return all(needed["sensitivity"] <= (other if other is not None else math.inf) / 2
               for order, other in needed.items() if order != "sensitivity")


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [f"# INT8 sensitivity: layers kept in FP16 by three orders ({doc['stamp']})", "",
             f"Goal (stated before the run): {doc['goal']}.", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['kernels']} ({' '.join(m['vector_flags'])}). "
             f"Calibration {doc['method']}, weights {'per tensor' if doc['per_tensor'] else 'per channel'}, "
             f"{int(100 * doc['held_out'])}% of the calibration images held out for the sensitivity. "
             f"Goal met on {sum(r['goal_met'] is True for r in doc['runs'])} of {len(doc['runs'])} runs "
             f"({sum(r['goal_met'] is None for r in doc['runs'])} with nothing to regain).", ""]
    for run in doc["runs"]:
        lines += [f"## {run['run']}", "",
                  f"{run['task']}, FP32 {100 * run['fp32']:.2f}, budget {run['budget_points']} points, "
                  f"{run['quantized_layers']} quantized layers, {run['seconds']} s. Layers needed to meet the budget: "
                  + ", ".join(f"{order} {k if k is not None else 'more than tried'}"
                              for order, k in run["layers_needed"].items())
                  + f"; goal {'met' if run['goal_met'] else 'not met' if run['goal_met'] is False else 'moot'}.", "",
                  "| k | " + " | ".join(f"{order}: change, points (MACs in FP16)" for order in run["curves"]) + " |",
                  "|---|" + "---|" * len(run["curves"])]
        ks = sorted({p["k"] for curve in run["curves"].values() for p in curve})
        for k in ks:
            cells = []
            for curve in run["curves"].values():
                point = next((p for p in curve if p["k"] == k), None)
                cells.append("—" if point is None else f"{-point['drop_points'] + 0.0:+.2f}"
                             + (" ✓" if point["within"] else "") + f" ({100 * point['kept_macs_fraction']:.1f}%)")
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from bench.recipe_seeds import machine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="finished runs (through export)")
    parser.add_argument("--method", default="max", help="calibration method (default: max)")
    parser.add_argument("--per-tensor", action="store_true", help="weights per tensor (a harder INT8; ort only)")
    parser.add_argument("--quantizer", choices=("ort", "modelopt"), help="default: the recipe's")
    parser.add_argument("--calibration-images", type=int, help="calibrate on only this many (a harder INT8)")
    parser.add_argument("--budget", type=float, help="accuracy budget in points (default: the recipe's)")
    parser.add_argument("--outlier", type=float, help="plant one outlier channel this many times the others "
                                                      "(bench/int8_sensitivity.py: plant_outlier)")
    parser.add_argument("--plant-in", choices=("first-half", "not-largest"), default="first-half",
                        help="where the outlier goes (plant_outlier); default: a chain of the network's first half")
    parser.add_argument("--held-out", type=float, default=0.25)
    parser.add_argument("--ks", default=",".join(map(str, KS)), help="layers kept in float to try, comma-separated")
    parser.add_argument("--name", default=None, help="the result files' name (default: the first run's recipe)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    print(f"goal: {GOAL}", flush=True)
    ks = tuple(int(k) for k in args.ks.split(","))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = []
    for run_dir in args.runs:
        print(f"{run_dir}:", flush=True)
        runs.append(one_run(run_dir, args.method, args.per_tensor, args.held_out, ks, args.quantizer,
                            args.calibration_images, args.outlier, args.budget, args.plant_in))
        print(f"  layers needed: {runs[-1]['layers_needed']}; goal met: {runs[-1]['goal_met']}", flush=True)
    name = args.name or Path(json.loads((args.runs[0] / "manifest.json").read_text())["model"]).name
    doc = {"schema": "edgefold.bench.int8_sensitivity/1", "stamp": stamp, "goal": GOAL, "machine": machine(),
           "quantizer": args.quantizer or "the recipe's", "method": args.method,
           "calibration_images": args.calibration_images, "outlier": args.outlier, "budget": args.budget, "plant_in": args.plant_in,
           "per_tensor": args.per_tensor, "held_out": args.held_out, "ks": list(ks),
           "runs": runs}
    base = args.out / f"int8-sensitivity-{name}-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    base.with_suffix(".md").write_text(markdown(doc))
    print(f"wrote {base}.json and .md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

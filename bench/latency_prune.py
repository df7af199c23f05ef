"""MACs-target student against latency-target student at equal measured latency (issue #16).

    python bench/latency_prune.py --recipe tiny
    python bench/latency_prune.py --recipe tiny --arch resnet18 --macs-target 0.3 --tag resnet18-digits

For each recipe: (A) the recipe's MACs target, pruned and distilled; A's student is measured on a loopback
agent (deploy threads pinned to 1, ONNX Runtime CPU); (B) the same teacher (a copy of A's run) pruned to a
latency budget equal to A's measured latency on that agent, distilled with the same distill budget. Both
students are then measured again, interleaved, in one session on one agent, with more windows. Written to
bench/results/latency-prune-<tag>-<time>.{json,md}: top-1, measured latency with its spread, MACs, and the
latency table's prediction errors.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _recipe(base: dict, out: Path, prune: dict, arch: str | None, input_size: int | None = None) -> Path:
    raw = json.loads(json.dumps(base))
    raw["prune"] = prune
    if input_size:
        raw["preprocess"]["input_size"] = input_size
    raw.setdefault("deploy", {})["threads"] = 1  # a pinned thread count: latency comparable across runs
    if arch:
        raw["teacher"]["arch"] = arch
    out.write_text(yaml.safe_dump(raw))
    return out


def main() -> int:
    from pipeline import latency
    from pipeline.checkpoint import load_checkpoint
    from pipeline.models import count_macs
    from pipeline.recipe import LatencyTarget, load_recipe
    from pipeline.runner import run_pipeline

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument("--arch", default=None, help="replace the recipe's teacher architecture (a mid-size model)")
    parser.add_argument("--macs-target", type=float, default=None, help="default: the recipe's")
    parser.add_argument("--input-size", type=int, default=None, help="replace the recipe's input size")
    parser.add_argument("--round-to", type=int, default=None, help="replace the recipe's prune.round_to")
    parser.add_argument("--points", type=int, default=4, help="widths measured per group")
    parser.add_argument("--importance", default=None, help="the latency student's prune.importance (e.g. taylor)")
    parser.add_argument("--tag", default=None)
    parser.add_argument("--windows", type=int, default=3, help="windows per table measurement")
    parser.add_argument("--final-windows", type=int, default=7, help="windows of the final A/B measurement")
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()

    recipe, path, _ = load_recipe(args.recipe)
    base = yaml.safe_load(path.read_text())
    prune = {k: v for k, v in base["prune"].items() if k not in ("macs_target", "latency")}
    if args.round_to:
        prune["round_to"] = args.round_to
    macs_target = args.macs_target or recipe.prune.macs_target
    tag = args.tag or recipe.name
    work = Path(tempfile.mkdtemp(prefix="edgefold-latency-bench-"))
    runs = work / "runs"
    started = time.time()
    try:
        # (A) the MACs target.
        recipe_a = _recipe(base, work / "a.yaml", {**prune, "macs_target": macs_target}, args.arch,
                           args.input_size)
        ctx_a = run_pipeline(str(recipe_a), until="distill", runs_dir=runs, run_id="macs")
        target = LatencyTarget(device="edge", ms=1.0, windows=args.windows, points=4, rounds=3, duration_s=0.3)
        input_shape = ctx_a.preprocess.input_shape(1)
        student_a, info = load_checkpoint(ctx_a.manifest.output("distill", "model"))
        with latency.open_agent([], "edge", print) as (client, device_info, identity):
            spec = latency.device_spec(device_info, ctx_a.recipe.deploy, target, ctx_a.preprocess.to_dict(), "bench")
            meter = latency.Meter(client, spec, identity, work / "cache-a", work / "onnx", args.final_windows,
                                  ctx_a.recipe.export.opset, input_shape)
            a_ms = meter.measure({"a": student_a})["a"].p50_ms
        print(f"bench: MACs student measured {a_ms:.4f} ms", file=sys.stderr)

        # (B) the latency target at A's measured latency, from a copy of A's run (the same teacher).
        shutil.copytree(runs / ctx_a.run_dir.parent.name / "macs", runs / ctx_a.run_dir.parent.name / "latency")
        for stage in ("prune", "distill"):
            shutil.rmtree(runs / ctx_a.run_dir.parent.name / "latency" / stage, ignore_errors=True)
        latency_cfg = {"device": "edge", "ms": a_ms, "windows": args.windows, "points": args.points, "rounds": 6,
                       "duration_s": 0.3, "tolerance": 0.05}
        prune_b = {**prune, "latency": latency_cfg, **({"importance": args.importance} if args.importance else {})}
        recipe_b = _recipe(base, work / "b.yaml", prune_b, args.arch,
                           args.input_size)
        ctx_b = run_pipeline(str(recipe_b), until="distill", runs_dir=runs, run_id="latency",
                             force=("prune", "distill"))
        student_b, _ = load_checkpoint(ctx_b.manifest.output("distill", "model"))

        # Both students, interleaved windows, one session on one agent.
        with latency.open_agent([], "edge", print) as (client, device_info, identity):
            spec = latency.device_spec(device_info, ctx_a.recipe.deploy, target, ctx_a.preprocess.to_dict(), "bench")
            meter = latency.Meter(client, spec, identity, work / "cache-final", work / "onnx-final",
                                  args.final_windows, ctx_a.recipe.export.opset, input_shape)
            final = meter.measure({"macs": student_a, "latency": student_b, "teacher": load_checkpoint(
                ctx_a.manifest.output("teacher", "model"))[0]})
        teacher_macs = count_macs(load_checkpoint(ctx_a.manifest.output("teacher", "model"))[0], input_shape)
        lat = ctx_b.manifest.stage("prune")["metrics"]["latency"]
        rows = []
        for name, ctx, model in (("MACs target", ctx_a, student_a), ("latency target", ctx_b, student_b)):
            key = "macs" if ctx is ctx_a else "latency"
            m = final[key]
            rows.append({"student": name, "top1": ctx.manifest.stage("distill")["metrics"]["top1"],
                         "pruned_top1": ctx.manifest.stage("prune")["metrics"]["top1"],
                         "latency_ms": m.to_json(), "macs_g": count_macs(model, input_shape) / 1e9,
                         "macs_fraction": count_macs(model, input_shape) / teacher_macs,
                         "params_m": ctx.manifest.stage("distill")["metrics"].get("params_m")})
        result = {"recipe": tag, "importance_latency_student": args.importance or prune.get("importance", "l2"), "arch": info["arch"], "input_shape": list(input_shape), "threads": 1,
                  "runtime": spec.runtime, "macs_target": macs_target, "a_ms_budget": a_ms,
                  "teacher_ms": final["teacher"].to_json(), "rows": rows,
                  "table": {"check": lat["check"], "plan_predicted_ms": lat["predicted_ms"],
                            "plan_measured_ms": lat["measured_ms"], "prediction_error": lat["prediction_error"],
                            "rounds": lat["rounds"], "jobs": lat["jobs"]},
                  "widths": ctx_b.manifest.stage("prune")["metrics"]["plan"]["widths"],
                  "macs_plan": ctx_a.manifest.stage("prune")["metrics"]["plan"],
                  "seconds": time.time() - started}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    (out / f"latency-prune-{tag}-{stamp}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"latency-prune-{tag}-{stamp}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def markdown(r: dict) -> str:
    a, b = r["rows"]
    speed = a["latency_ms"]["p50_ms"] / b["latency_ms"]["p50_ms"]
    lines = [f"## Latency-target against MACs-target pruning: {r['recipe']} ({r['arch']}, input "
             f"{'×'.join(map(str, r['input_shape'][1:]))}), loopback agent, {r['runtime']}, threads={r['threads']}",
             "", f"Teacher {r['teacher_ms']['p50_ms']:.4f} ms. Latency budget = the MACs student's measured "
                 f"{r['a_ms_budget']:.4f} ms. Total {r['seconds'] / 60:.1f} min.", "",
             "| student | top-1 (distilled) | top-1 (pruned, before KD) | latency p50 ms [window spread] | GMACs | "
             "MACs vs teacher |", "|---|---:|---:|---:|---:|---:|"]
    for row in r["rows"]:
        m = row["latency_ms"]
        lines.append(f"| {row['student']} | {100 * row['top1']:.2f}% | {100 * row['pruned_top1']:.2f}% | "
                     f"{m['p50_ms']:.4f} [{m['spread_ms'][0]:.4f}–{m['spread_ms'][1]:.4f}] | {row['macs_g']:.4f} | "
                     f"{100 * row['macs_fraction']:.1f}% |")
    lines += ["", f"Δ top-1 (latency − MACs): {100 * (b['top1'] - a['top1']):+.2f} points; latency ratio "
                  f"MACs/latency student: {speed:.2f}×.", "", "Latency table check (predicted vs measured):", "",
              "| network | predicted ms | measured ms | error |", "|---|---:|---:|---:|"]
    for name, c in r["table"]["check"].items():
        lines.append(f"| {name} | {c['predicted_ms']:.4f} | {c['measured_ms']['p50_ms']:.4f} | "
                     f"{100 * c['error']:+.1f}% |")
    lines += ["", f"Latency plan widths: {r['widths']}", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

"""MACs-target student against latency-target student at equal measured latency (issue #16).

    python bench/latency_prune.py --recipe tiny
    python bench/latency_prune.py --recipe tiny --arch resnet18 --macs-target 0.3 --tag resnet18-digits

For each recipe: (A) the recipe's MACs target, pruned and distilled; A's student is measured on a loopback
agent (deploy threads pinned to 1, ONNX Runtime CPU); (B) the same teacher (a copy of A's run) pruned to a
latency budget equal to A's measured latency on that agent, distilled with the same distill budget; (C) the
same, to A's latency divided by ``--speedup`` (the goal's 1.3×): does it keep A's top-1? The students are then
measured again, interleaved, in one session on one agent, with more windows. Written to
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


def _recipe(base: dict, out: Path, prune: dict, arch: str | None, input_size: int | None = None,
            teacher_epochs: int | None = None) -> Path:
    raw = json.loads(json.dumps(base))
    raw["prune"] = prune
    if teacher_epochs:
        raw["teacher"]["train"]["epochs"] = teacher_epochs
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
    parser.add_argument("--widths-per-group", type=int, default=4, help="widths measured per channel group")
    parser.add_argument("--importance", default=None, help="the latency student's prune.importance (e.g. taylor)")
    parser.add_argument("--teacher-epochs", type=int, default=None,
                        help="replace the teacher's epochs (the teacher is shared by every arm)")
    parser.add_argument("--speedup", type=float, default=1.3,
                        help="arm C's budget: the MACs student's latency divided by this (0: no arm C)")
    parser.add_argument("--precision", choices=("deployed", "float"), default="deployed",
                        help="what the table and the final measurement time: the deployed INT8 rung, or the float student")
    parser.add_argument("--max-pruning-ratio", type=float, default=None,
                        help="the latency students' prune.latency.max_pruning_ratio (default: the recipe's)")
    parser.add_argument("--tag", default=None)
    parser.add_argument("--windows", type=int, default=3, help="windows per table measurement")
    parser.add_argument("--final-windows", type=int, default=7, help="windows of the final A/B measurement")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--keep", default=None, help="keep the runs in this folder; a re-run resumes from it")
    parser.add_argument("--paired", default=None, metavar="RESULT.json",
                        help="only (re)compute the paired comparison of a finished result from its --keep runs")
    args = parser.parse_args()
    if args.paired:
        if not args.keep:
            parser.error("--paired needs the --keep folder the result's runs were kept in")
        path = Path(args.paired)
        result = paired(json.loads(path.read_text()), Path(args.keep) / "runs")
        path.write_text(json.dumps(result, indent=1) + "\n")
        path.with_suffix(".md").write_text(markdown(result))
        print(markdown(result))
        return 0

    recipe, path, _ = load_recipe(args.recipe)
    base = yaml.safe_load(path.read_text())
    prune = {k: v for k, v in base["prune"].items() if k not in ("macs_target", "latency")}
    if args.round_to:
        prune["round_to"] = args.round_to
    macs_target = args.macs_target or recipe.prune.macs_target
    tag = args.tag or recipe.name
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="edgefold-latency-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = work / "runs"
    started = time.time()
    try:
        # (A) the MACs target.
        recipe_a = _recipe(base, work / "a.yaml", {**prune, "macs_target": macs_target}, args.arch,
                           args.input_size, args.teacher_epochs)
        ctx_a = run_pipeline(str(recipe_a), until="distill", runs_dir=runs, run_id="macs")
        target = LatencyTarget(device="edge", ms=1.0, windows=args.windows, widths_per_group=4, rounds=3, duration_s=0.3,
                               precision=args.precision)
        input_shape = ctx_a.preprocess.input_shape(1)
        student_a, info = load_checkpoint(ctx_a.manifest.output("distill", "model"))
        with latency.open_agent([], "edge", print) as (client, device_info, identity):
            spec = latency.device_spec(device_info, ctx_a.recipe.deploy, target, ctx_a.preprocess.to_dict(), "bench")
            meter = latency.Meter(client, spec, identity, work / "cache-a", work / "onnx", args.final_windows,
                                  ctx_a.recipe.export.opset, input_shape)
            a_ms = meter.measure({"a": student_a})["a"].p50_ms
        print(f"bench: MACs student measured {a_ms:.4f} ms", file=sys.stderr)

        # (B) the latency target at A's measured latency, (C) at A's divided by --speedup: each from a copy of
        # A's run (the same teacher), sharing the latency table's cache.
        arms = [("latency", "latency target (= MACs student's latency)", a_ms)]
        if args.speedup:
            arms.append(("speed", f"latency target (MACs student's latency / {args.speedup:g})", a_ms / args.speedup))
        students, contexts, failures = {}, {}, {}
        parent = runs / ctx_a.run_dir.parent.name
        for key, _, budget_ms in arms:
            fresh = not (parent / key).exists()  # a kept arm resumes: its completed stages stay cached
            if fresh:
                shutil.copytree(parent / "macs", parent / key)
                for stage in ("prune", "distill"):
                    shutil.rmtree(parent / key / stage, ignore_errors=True)
            latency_cfg = {"device": "edge", "ms": budget_ms, "windows": args.windows, "widths_per_group": args.widths_per_group,
                           "rounds": 8, "duration_s": 0.3, "tolerance": 0.05, "precision": args.precision}
            if args.max_pruning_ratio is not None:
                latency_cfg["max_pruning_ratio"] = args.max_pruning_ratio
            prune_b = {**prune, "latency": latency_cfg, **({"importance": args.importance} if args.importance else {})}
            recipe_b = _recipe(base, work / f"{key}.yaml", prune_b, args.arch, args.input_size, args.teacher_epochs)
            try:
                contexts[key] = run_pipeline(str(recipe_b), until="distill", runs_dir=runs, run_id=key,
                                             force=("prune", "distill") if fresh else ())
            except Exception as err:  # noqa: BLE001 - one arm's failure is a result, the others still count
                failures[key] = f"{type(err).__name__}: {err}".replace("\n", " ")
                print(f"bench: arm {key} failed: {failures[key]}", file=sys.stderr)
                continue
            students[key] = load_checkpoint(contexts[key].manifest.output("distill", "model"))[0]

        # Every student, interleaved windows, one session on one agent.
        with latency.open_agent([], "edge", print) as (client, device_info, identity):
            spec = latency.device_spec(device_info, ctx_a.recipe.deploy, target, ctx_a.preprocess.to_dict(), "bench")
            meter = latency.Meter(client, spec, identity, work / "cache-final", work / "onnx-final",
                                  args.final_windows, ctx_a.recipe.export.opset, input_shape)
            final = meter.measure({"macs": student_a, **students, "teacher": load_checkpoint(
                ctx_a.manifest.output("teacher", "model"))[0]})
        teacher_macs = count_macs(load_checkpoint(ctx_a.manifest.output("teacher", "model"))[0], input_shape)
        rows = [_row("MACs target", "macs", ctx_a, student_a, final, input_shape, teacher_macs)]
        for key, label, budget_ms in arms:
            if key in students:
                rows.append({**_row(label, key, contexts[key], students[key], final, input_shape, teacher_macs),
                             "budget_ms": budget_ms, "table": _table(contexts[key])})
            else:
                rows.append({"student": label, "key": key, "budget_ms": budget_ms, "failed": failures[key]})
        result = {"recipe": tag, "importance_latency_student": args.importance or prune.get("importance", "l2"),
                  "max_pruning_ratio": (args.max_pruning_ratio if args.max_pruning_ratio is not None
                                        else LatencyTarget(ms=1.0).max_pruning_ratio), "arch": info["arch"], "input_shape": list(input_shape), "threads": 1,
                  "teacher_epochs": args.teacher_epochs, "teacher_top1": ctx_a.manifest.stage("teacher")["metrics"]["top1"],
                  "runtime": spec.runtime, "precision": spec.precision, "macs_target": macs_target, "a_ms_budget": a_ms, "speedup": args.speedup,
                  "teacher_ms": final["teacher"].to_json(), "rows": rows,
                  "macs_plan": ctx_a.manifest.stage("prune")["metrics"]["plan"],
                  "seconds": time.time() - started}
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.keep:
        result = paired(result, Path(args.keep) / "runs")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    (out / f"latency-prune-{tag}-{stamp}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"latency-prune-{tag}-{stamp}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


def _row(label: str, key: str, ctx, model, final, input_shape, teacher_macs: int) -> dict:
    from pipeline.models import count_macs

    macs = count_macs(model, input_shape)
    return {"student": label, "key": key, "top1": ctx.manifest.stage("distill")["metrics"]["top1"],
            "top1_correct": ctx.manifest.stage("distill")["metrics"].get("top1_correct"),
            "images": ctx.manifest.stage("distill")["metrics"].get("images"),
            "pruned_top1": ctx.manifest.stage("prune")["metrics"]["top1"], "latency_ms": final[key].to_json(),
            "macs_g": macs / 1e9, "macs_fraction": macs / teacher_macs,
            "params_m": ctx.manifest.stage("distill")["metrics"].get("params_m")}


def _table(ctx) -> dict:
    lat = ctx.manifest.stage("prune")["metrics"]["latency"]
    return {"check": lat["check"], "plan_predicted_ms": lat["predicted_ms"], "plan_measured_ms": lat["measured_ms"],
            "prediction_error": lat["prediction_error"], "rounds": lat["rounds"], "jobs": lat["jobs"],
            "widths": ctx.manifest.stage("prune")["metrics"]["plan"]["widths"]}


def paired(result: dict, runs: Path) -> dict:
    """Each arm against the MACs student on the same test images and the same measurement rounds: McNemar's
    exact test on the images one of the two gets right (pipeline.perclass), and the latency ratio with a
    bootstrap interval over the interleaved windows (pipeline.stats), paired by window."""
    import numpy as np

    from pipeline.data.sources import load_source
    from pipeline.perclass import mcnemar_exact
    from pipeline.stats import ratio_interval

    parent = next(p for p in runs.iterdir() if (p / "macs").is_dir())
    dataset = load_source(yaml.safe_load((runs.parent / "a.yaml").read_text())["data"]["source"])
    with np.load(parent / "macs" / "data" / "splits.npz") as splits:
        labels = dataset.test.labels[splits["test"]] if "test" in splits.files else dataset.test.labels
    a = result["rows"][0]
    predicted_a = np.load(parent / a["key"] / "distill" / "predictions.npy")
    for row in result["rows"][1:]:
        if "failed" in row:
            continue
        predicted = np.load(parent / row["key"] / "distill" / "predictions.npy")
        only_a = int(np.sum((predicted_a == labels) & (predicted != labels)))
        only_row = int(np.sum((predicted == labels) & (predicted_a != labels)))
        ratio = ratio_interval(a["latency_ms"]["windows_ms"], row["latency_ms"]["windows_ms"])
        row["paired"] = {"only_macs_correct": only_a, "only_this_correct": only_row,
                         "mcnemar_p": mcnemar_exact(only_a, only_row),
                         "macs_over_this_latency": list(ratio)}
    return result


def markdown(r: dict) -> str:
    a = r["rows"][0]
    lines = [f"## Latency-target against MACs-target pruning: {r['recipe']} ({r['arch']}, input "
             f"{'×'.join(map(str, r['input_shape'][1:]))}), loopback agent, {r['runtime']} {r.get('precision', 'fp32')}, threads={r['threads']}",
             "", f"Teacher top-1 {100 * r['teacher_top1']:.2f}%, {r['teacher_ms']['p50_ms']:.4f} ms. Latency students' "
                 f"importance: {r['importance_latency_student']}. MACs student measured {r['a_ms_budget']:.4f} ms "
                 f"before the others were pruned. Total {r['seconds'] / 60:.1f} min.", "",
             "| student | budget ms | top-1 (distilled) | top-1 (pruned, before KD) | latency p50 ms [window spread] | "
             "GMACs | MACs vs teacher |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in r["rows"]:
        if "failed" in row:
            lines.append(f"| {row['student']} | {row['budget_ms']:.4f} | failed: {row['failed']} | | | | |")
            continue
        m = row["latency_ms"]
        budget = f"{row['budget_ms']:.4f}" if "budget_ms" in row else "—"
        lines.append(f"| {row['student']} | {budget} | {100 * row['top1']:.2f}% | {100 * row['pruned_top1']:.2f}% | "
                     f"{m['p50_ms']:.4f} [{m['spread_ms'][0]:.4f}–{m['spread_ms'][1]:.4f}] | {row['macs_g']:.4f} | "
                     f"{100 * row['macs_fraction']:.1f}% |")
    lines.append("")
    for row in r["rows"][1:]:
        if "failed" in row:
            continue
        speed = a["latency_ms"]["p50_ms"] / row["latency_ms"]["p50_ms"]
        line = (f"* {row['student']}: Δ top-1 against the MACs student {100 * (row['top1'] - a['top1']):+.2f} "
                f"points; MACs student's latency / this one's: {speed:.2f}×")
        if "paired" in row:
            p = row["paired"]
            low, high = p["macs_over_this_latency"][1:]
            line += (f" [{low:.2f}, {high:.2f}] over paired windows; images only the MACs student gets right "
                     f"{p['only_macs_correct']}, only this one {p['only_this_correct']} (McNemar exact p = "
                     f"{p['mcnemar_p']:.3g})")
        lines.append(line + ".")
    for row in r["rows"][1:]:
        if "failed" in row:
            continue
        lines += ["", f"Latency table check, {row['student']} (predicted vs measured):", "",
                  "| network | predicted ms | measured ms | error |", "|---|---:|---:|---:|"]
        for name, c in (row["table"]["check"] or {}).items():
            lines.append(f"| {name} | {c['predicted_ms']:.4f} | {c['measured_ms']['p50_ms']:.4f} | "
                         f"{100 * c['error']:+.1f}% |")
        lines += ["", f"Widths: {row['table']['widths']}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

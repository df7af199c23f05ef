"""Classification's part of the evaluate stage (:mod:`pipeline.stages.evaluate`): every rung's top-1/top-5, params,
MACs and size as the stage that made it recorded them, and the per-class results of the predictions each kept.

Each producing stage already scored its own checkpoint on the test split (the INT8 rung under ONNX Runtime, the FP16
forms at export) and counted its params and MACs; nothing is loaded or scored a second time here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.ladder import EvaluateHooks
from pipeline.core.rungs import DEPLOYED, RUNGS, predictions_output
from pipeline.perclass import summarize
from pipeline.tasks.classification.scores import verdict
from pipeline.tasks.classification.images import data_set, recorded_splits

RECORDED = ("top1", "top5", "params_m", "macs_g", "top1_correct", "images", "sanity")


class ClassificationEvaluate(EvaluateHooks):
    """The ladder's rows from the teacher, prune, distill, export and quantize records."""

    score = "top1"

    def needs(self, ctx):
        ran = tuple(r.checkpoint_stage for r in RUNGS.values() if r.checkpoint_stage
                    and ctx.manifest.stage(r.checkpoint_stage))
        return ran + tuple(s for s in ("export", "quantize") if ctx.manifest.stage(s))

    def config(self, ctx):
        return {"evaluate": ctx.recipe.section("evaluate")}

    def rows(self, ctx):
        rungs = {}
        exported = (ctx.manifest.stage("export") or {}).get("metrics", {}).get("rungs", {})
        for rung, stage in ((name, r.checkpoint_stage) for name, r in RUNGS.items() if r.checkpoint_stage):
            entry = ctx.manifest.stage(stage)
            if "started_from" in exported.get(rung, {}):  # an ONNX start's graph, scored at export
                rungs[rung] = _started(ctx, rung, exported[rung])
                continue
            if not entry:
                continue
            path = ctx.manifest.output(stage, "model")
            rungs[rung] = {key: entry["metrics"][key] for key in RECORDED if key in entry["metrics"]}
            rungs[rung].update(size_mb=path.stat().st_size / 1e6, artifact=str(path.relative_to(ctx.run_dir)))
            if rung in exported:
                rungs[rung]["onnx_mb"] = exported[rung]["size_mb"]
        # The INT8 rung is the student's network in another precision: its size and scores are its own.
        stage, key = RUNGS[DEPLOYED].onnx
        quantized = ctx.manifest.stage(stage)
        source = RUNGS[DEPLOYED].form_of
        if quantized and source in rungs:
            path = ctx.manifest.output(stage, key)
            size_mb = path.stat().st_size / 1e6
            rungs[DEPLOYED] = {**rungs[source], **{k: quantized["metrics"][k] for k in RECORDED
                                                      if k in quantized["metrics"]},
                               "size_mb": size_mb, "onnx_mb": size_mb, "artifact": str(path.relative_to(ctx.run_dir))}
        # The FP16 forms: the same network as their FP32 rung, scored by the export stage (host emulation).
        for name, facts in exported.items():
            rung = RUNGS.get(name)
            if rung is None or rung.precision != "fp16" or rung.form_of not in rungs:
                continue
            path = ctx.manifest.output("export", name)
            rungs[name] = {**rungs[rung.form_of], **{k: facts["scores"][k] for k in RECORDED if k in facts["scores"]},
                           "size_mb": facts["size_mb"], "onnx_mb": facts["size_mb"],
                           "artifact": str(path.relative_to(ctx.run_dir)), "host_emulated": True,
                           "top1_agreement_with_fp32": facts["top1_agreement_with_fp32"]}
        rungs = {name: rungs[name] for name in RUNGS if name in rungs}  # the ladder's order
        for name, values in rungs.items():
            values["precision"] = RUNGS[name].precision
        return rungs

    def finish(self, ctx, workdir: Path, rows):
        per_class = _per_class(ctx, rows)
        if not per_class:
            return {}, {}
        for name, values in rows.items():
            if name in per_class["rungs"]:
                values["never_predicted"] = per_class["rungs"][name]["never_predicted"]
        # The confusion matrices go to a file (classes² numbers); the manifest keeps what the report shows.
        (workdir / "per_class.json").write_text(json.dumps(per_class, indent=1) + "\n")
        return {"per_class": workdir / "per_class.json"}, {"per_class": {
            "classes": per_class["classes"],
            "accuracy": {rung: scores["accuracy"] for rung, scores in per_class["rungs"].items()},
            "never_predicted": {rung: scores["never_predicted"] for rung, scores in per_class["rungs"].items()},
            "comparisons": per_class["comparisons"]}}

    def summary(self, metrics):
        return ", ".join(f"{name} {100 * r['top1']:.2f}%" for name, r in metrics["rungs"].items())


def _started(ctx, rung: str, facts: dict) -> dict:
    """The recorded figures of a rung the export stage took from the user's ONNX file."""
    values = {**facts["scores"], "params_m": facts["params_m"], "macs_g": facts["macs_g"], "sanity": facts["sanity"]}
    return {**{key: values[key] for key in RECORDED if key in values}, "size_mb": facts["size_mb"],
            "onnx_mb": facts["size_mb"], "started_from": facts["started_from"]["path"],
            "artifact": str(ctx.manifest.output("export", rung).relative_to(ctx.run_dir))}


def _per_class(ctx, rungs: dict) -> dict[str, Any] | None:
    """Per-class results from the predictions each producing stage kept (every rung, same test images)."""
    predictions = {}
    for rung, (stage, key) in ((name, predictions_output(ctx.manifest, name)) for name in RUNGS):
        entry = ctx.manifest.stage(stage)
        if rung in rungs and entry and key in entry["outputs"]:
            predictions[rung] = np.load(ctx.manifest.output(stage, key), allow_pickle=False)
    if not predictions:
        return None
    dataset = data_set(ctx)
    labels = dataset.test.labels[recorded_splits(ctx)["test"]]
    return summarize(labels, predictions, dataset.classes)


def ladder_table(rungs: dict) -> str:
    """The rungs as a fixed-width text table (printed by ``make edge``)."""
    header = (f"{'rung':<13}{'top-1':>9}{'Δ pts':>8}{'top-5':>9}{'params M':>10}{'GMACs':>9}{'MACs %':>8}"
              f"{'ckpt MB':>9}{'ONNX MB':>9}")
    lines = [header, "-" * len(header)]
    for name, r in rungs.items():
        lines.append(
            f"{name:<13}{100 * r['top1']:>8.2f}%{r.get('top1_delta_points', 0.0):>+8.2f}{100 * r['top5']:>8.2f}%"
            f"{r['params_m']:>10.2f}{r['macs_g']:>9.3f}{100 * r.get('macs_fraction', 1.0):>7.1f}%{r['size_mb']:>9.1f}"
            + (f"{r['onnx_mb']:>9.1f}" if "onnx_mb" in r else f"{'-':>9}")
            + (f"  {verdict(name, r)}" if verdict(name, r) else "")
        )
    return "\n".join(lines)

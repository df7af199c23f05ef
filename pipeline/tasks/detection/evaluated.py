"""Detection's part of the evaluate stage (:mod:`pipeline.stages.evaluate`): every rung's host mAP (with intervals)
as its own stage measured it, its artifact and size.

Every figure was measured where the rung was made (the teacher and distill stages through torchvision's
post-processing, which the export stage showed the device's decode reproduces; the INT8 forms through ONNX Runtime
and the device's decode); nothing is scored a second time here.
"""

from __future__ import annotations

from pipeline.core.ladder import EvaluateHooks

SCORED = ("map", "map_low", "map_high", "ap50", "ap50_low", "ap50_high", "ap75", "ap75_low", "ap75_high",
          "per_class_ap")


def _row(scores: dict, artifact: str, size_mb: float, **extra) -> dict:
    return {"artifact": artifact, "size_mb": size_mb, **{key: scores.get(key) for key in SCORED}, **extra}


class DetectionEvaluate(EvaluateHooks):
    """The ladder's rows from the teacher, distill, export and quantize records (each INT8 box head its own rung)."""

    score = "map"

    def needs(self, ctx):
        return ("export", "quantize") if ctx.recipe.start is not None else ("teacher", "distill", "export", "quantize")

    def rows(self, ctx):
        m = ctx.manifest
        export, quantize = m.stage("export"), m.stage("quantize")
        rungs = export["metrics"]["rungs"]
        q = quantize["metrics"]
        # A detector brought as ONNX has no teacher; its MACs are counted from its graph.
        started = ctx.recipe.start is not None
        macs = rungs["student"]["macs_g"] if started else m.stage("distill")["metrics"]["macs_g"]
        ladder = {} if started else {
            "teacher": _row(m.stage("teacher")["metrics"], export["outputs"]["teacher"], rungs["teacher"]["size_mb"],
                            precision="fp32", macs_g=m.stage("teacher")["metrics"]["macs_g"])}
        ladder.update({
            "student": _row(q["fp32"], export["outputs"]["student"], rungs["student"]["size_mb"], precision="fp32",
                            macs_g=macs),
            "student_int8": _row(q["int8"], quantize["outputs"]["student_int8"], q["size_mb"], precision="int8",
                                 box_head=q["box_head"], macs_g=macs),
        })
        for other in q.get("other_box_heads", ()):
            key = f"student_int8_box_{other['box_head']}"
            ladder[key] = _row(other["scores"], quantize["outputs"][key], other["size_mb"], precision="int8",
                               box_head=other["box_head"], macs_g=macs)
        return ladder

    def summary(self, metrics):
        return ", ".join(f"{name} mAP {100 * row['map']:.1f}" for name, row in metrics["rungs"].items()
                         if row.get("map") is not None)

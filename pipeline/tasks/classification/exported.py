"""Classification's part of the export stage (:class:`pipeline.export.hooks.ExportHooks`): ONNX (opset ≥ 17,
dynamic batch, BatchNorm folded) for every measured rung, with its outputs checked against torch on real test images
by ONNX Runtime; when ``deploy.runtimes`` names ``torch_tensorrt``, each float rung's device checkpoint
(``<rung>.device.pt``: state, architecture key with its source and fingerprint, input C×H×W), rebuilt here by the
device's own loader and checked against the rung's outputs: the Torch-TensorRT road's artifact (the device casts it to
FP16 itself for an FP16 rung, so only the float rungs get one); with ``deploy.torch_programs`` also a ``torch.export``
program (``<rung>.pt2``, torch version recorded, run back through the agent's Torch runner for parity) for agents that
trust programs; and the FP16 forms (``teacher_fp16``, ``student_fp16``): FP16 weights and compute written in the
graph, float32 I/O, scored on the whole test split by ONNX Runtime — an emulation on the host's CPU (casts around
most nodes), labelled so; the device's own figure comes from the engine it timed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from device.errors import StageError
from pipeline.checkpoint import load_checkpoint
from pipeline.core.rungs import RUNGS
from pipeline.export.hooks import Exported, ExportHooks
from pipeline.models import as_exported
from pipeline.export.onnx import check_parity, export_onnx
from pipeline.tasks.classification.onnx_scores import onnx_accuracy
from pipeline.tasks.classification.scores import recorded_scores, require_sane
from pipeline.tasks.classification.torch_export import write_device_checkpoint
from pipeline.tasks.classification.images import data_set, image_batches, preprocess_of
from pipeline.core.ladder import size_text

# Calibration images whose activations decide which layers of an FP16 rung stay FP32. AutoCast's reference run keeps
# every intermediate tensor of every image (Polygraphy's comparator), so they are few: a ResNet-50 at 224 px holds
# about 100 MB of activations per image.
FP16_RANGE_IMAGES = 16


class ClassificationExport(ExportHooks):
    """Classification's export: see the module's docstring."""

    def keys(self, ctx):
        return {"preprocess": preprocess_of(ctx).to_dict(), "runtimes": list(ctx.recipe.deploy.runtimes),
                "torch_programs": ctx.recipe.deploy.torch_programs}

    def inspect_start(self, ctx):
        """That the file is an ONNX model, its input against the declared layout and preprocessing, its opset and
        operators against TensorRT 10's parser, its output against the data's class count
        (:func:`pipeline.export.onnx_start.inspect_start`)."""
        from pipeline.export.onnx_start import inspect_start

        start, pre = ctx.recipe.start, preprocess_of(ctx)
        return inspect_start(start.onnx, start.layout, pre.channels, pre.input_size, len(data_set(ctx).classes))

    def rungs(self, ctx):
        return {rung: RUNGS[rung].checkpoint_stage for rung in ctx.recipe.export.rungs}

    def probe(self, ctx):
        cfg = ctx.recipe.export
        return next(iter(image_batches(ctx, "test", cfg.parity_images)))[0][: cfg.parity_images].numpy()

    def export(self, ctx, rung, stage, workdir, probe):
        cfg = ctx.recipe.export
        model, info = load_checkpoint(ctx.manifest.output(stage, "model"))
        path = workdir / f"{rung}.onnx"
        inference, folded_here = as_exported(model, info["arch"], info["folded"])  # a pruned rung is already
        facts = export_onnx(inference, path, preprocess_of(ctx).input_shape(1), cfg.opset)
        parity = check_parity(model, path, probe)  # the folded graph against the trained model
        metrics = {**facts, "parity": parity, "branches_folded": folded_here or info["folded"]}
        if parity["max_abs_diff"] > cfg.parity_atol or parity["top1_agreement"] < cfg.min_top1_agreement:
            raise StageError(
                f"ONNX export of {rung} disagrees with torch: max |Δlogit| {parity['max_abs_diff']:.3g} "
                f"(allowed {cfg.parity_atol:g}), top-1 agreement {100 * parity['top1_agreement']:.1f}% "
                f"(required {100 * cfg.min_top1_agreement:.1f}%)",
                fix="report this model to EdgeFold; try export.opset: 18, or loosen export.parity_atol",
            )
        outputs = {rung: path}
        if "torch_tensorrt" in ctx.recipe.deploy.runtimes:
            outputs[f"{rung}_device_checkpoint"] = self._device_checkpoint(
                ctx, model, rung, workdir, probe, metrics, (inference, info) if folded_here else None)
            if ctx.recipe.deploy.torch_programs:  # only for agents that trust programs (--trust-programs)
                outputs[f"{rung}_pt2"] = self._program(ctx, model, rung, workdir, probe, metrics)
        return Exported(outputs, {rung: metrics})

    def finish(self, ctx, workdir, exported):
        if ctx.recipe.export.fp16_rungs:
            exported.outputs.update(self._fp16_forms(ctx, workdir, exported.outputs, exported.rungs))
        # The device needs the preprocessing with the model to feed it correctly.
        (workdir / "preprocess.json").write_text(json.dumps(preprocess_of(ctx).to_dict(), indent=2) + "\n")
        exported.outputs["preprocess"] = workdir / "preprocess.json"

    @staticmethod
    def _device_checkpoint(ctx, model, rung: str, workdir: Path, images: np.ndarray, metrics: dict,
                           folded=None) -> Path:
        """Writes ``<rung>.device.pt`` and checks that the module the device's loader rebuilds from it gives the rung's
        outputs (the device builds it from its own architecture registry: nothing of the module travels). ``folded``:
        (the rung's inference form, its checkpoint's info), which the device then rebuilds, as a rung pruned folded."""
        from pipeline.checkpoint import save_checkpoint
        from pipeline.tasks.classification.torch_export import runner_parity

        cfg = ctx.recipe.export
        source = ctx.manifest.output(RUNGS[rung].checkpoint_stage, "model")
        if folded is not None:
            inference, info = folded
            source = save_checkpoint(workdir / f"{rung}.folded.pt", inference, info["arch"], info["num_classes"],
                                     preprocess_of(ctx).input_size, folded=True)
        path = write_device_checkpoint(source, workdir / f"{rung}.device.pt", preprocess_of(ctx).input_shape(1)[1:])
        parity = runner_parity(model, path, images)
        metrics["device_checkpoint"] = {"size_mb": path.stat().st_size / 1e6, "parity": parity}
        if parity["max_abs_diff"] > cfg.parity_atol or parity["top1_agreement"] < cfg.min_top1_agreement:
            raise StageError(f"the device checkpoint of {rung}, rebuilt as the device rebuilds it, disagrees with "
                             f"torch: max |Δlogit| {parity['max_abs_diff']:.3g} (allowed {cfg.parity_atol:g})",
                             fix="report this model to EdgeFold, or leave torch_tensorrt out of deploy.runtimes")
        return path

    @staticmethod
    def _program(ctx, model, rung: str, workdir: Path, images: np.ndarray, metrics: dict) -> Path:
        """Writes ``<rung>.pt2`` and checks it against torch as the agent's Torch runner runs it."""
        from pipeline.tasks.classification.torch_export import export_program, runner_parity

        cfg = ctx.recipe.export
        path = workdir / f"{rung}.pt2"
        facts = export_program(model, path, preprocess_of(ctx).input_shape(1))
        parity = runner_parity(model, path, images)
        metrics["program"] = {**facts, "parity": parity}
        if parity["max_abs_diff"] > cfg.parity_atol or parity["top1_agreement"] < cfg.min_top1_agreement:
            raise StageError(f"the torch.export program of {rung} disagrees with torch: max |Δlogit| "
                             f"{parity['max_abs_diff']:.3g} (allowed {cfg.parity_atol:g})",
                             fix="report this model to EdgeFold, or leave torch_tensorrt out of deploy.runtimes")
        return path

    def started(self, ctx, workdir, probe):
        from pipeline.export.onnx_start import graph_compute, start_parity, write_start_graph

        cfg, pre, start = ctx.recipe.export, preprocess_of(ctx), ctx.recipe.start
        path = workdir / "student.onnx"
        facts, written = write_start_graph(start.onnx, start.layout, pre.channels, pre.input_size,
                                           len(data_set(ctx).classes), path)
        parity = start_parity(facts, path, probe)
        if parity["max_abs_diff"] > cfg.parity_atol or parity["top1_agreement"] < cfg.min_top1_agreement:
            raise StageError(f"the rewritten {facts.path} disagrees with the given graph: max |Δlogit| "
                             f"{parity['max_abs_diff']:.3g} (allowed {cfg.parity_atol:g})",
                             fix="report this model to EdgeFold; meanwhile export it as the ladder writes it "
                                 "(one NCHW input 'input' with a dynamic batch, opset 17)")
        checked = self._probe_preprocessing(ctx, path)
        test_images, labels = self._test_split(ctx)
        predictions = workdir / "student.predictions.npy"
        scores = onnx_accuracy(path, test_images, labels, save_predictions=predictions)
        sanity = require_sane(f"the ONNX model {facts.path}", scores, data_set(ctx).classes,
                              causes="DATA is not the data it was trained on, or its classes come in another order; "
                                     "the preprocess section (size, mean, std, channels, layout) is not the one it was "
                                     "trained with",
                              fix="check DATA= and the recipe's preprocess and start.layout")
        student = {**written, "parity": parity, "started_from": facts.as_dict(), "sanity": sanity,
                   "preprocess_probe": checked, "scores": recorded_scores(scores),
                   **graph_compute(path, pre.input_shape(1)[1:])}
        ctx.log(f"export: the student is {facts.path} (sha256 {facts.sha256[:12]}…, opset {facts.opset}, "
                f"{facts.layout.upper()}): top-1 {100 * scores['top1']:.2f}% on the test split"
                + (f"; written with {', '.join(written['changes'])}" if written["changes"] else ""))
        return Exported({"student": path, "student_predictions": predictions}, {"student": student})

    @staticmethod
    def _probe_preprocessing(ctx, path: Path) -> dict | None:
        """The start's graph scored under the declared preprocessing and the plausible others
        (:func:`pipeline.tasks.classification.preprocess_probe.check_model`)."""
        from device.runners.onnxruntime import OnnxRuntimeRunner
        from pipeline.tasks.classification.preprocess_probe import check_model

        with OnnxRuntimeRunner(path) as runner:
            return check_model(ctx, runner.infer, ctx.recipe.start.preprocess_check, "export",
                               "start.preprocess_check")

    @staticmethod
    def _test_split(ctx) -> tuple[np.ndarray, np.ndarray]:
        images, labels = [], []
        for x, y, *_ in image_batches(ctx, "test", 500):
            images.append(x.numpy())
            labels.append(y.numpy())
        return np.concatenate(images), np.concatenate(labels)

    def _fp16_forms(self, ctx, workdir: Path, exported: dict, metrics: dict) -> dict:
        """Writes each FP16 rung from its exported FP32 ONNX and scores it on the test split."""
        from pipeline.quantize.fp16 import to_fp16

        cfg = ctx.recipe.export
        images, labels = self._test_split(ctx)
        # Which layers FP16's range cannot hold is decided on real images (the calibration slice, never the test
        # split): AutoCast's own reference run feeds random values in [-1, 1].
        calibration = next(iter(image_batches(ctx, "calib", FP16_RANGE_IMAGES)))[0].numpy()
        outputs = {}
        for rung in cfg.fp16_rungs:
            source = RUNGS[rung].form_of
            path = workdir / f"{source}.fp16.onnx"
            facts = to_fp16(exported[source], path, calibration=calibration)
            if facts["fp32_nodes_left"]:
                ctx.log(f"export: {rung} keeps {facts['fp32_nodes_left']} layers in FP32 (past FP16's range on the "
                        f"calibration images, or not convertible): {', '.join(facts['fp32_nodes'][:5])}")
            predictions = workdir / f"{rung}.predictions.npy"
            scores = onnx_accuracy(path, images, labels, save_predictions=predictions)
            reference = np.load(exported[f"{source}_predictions"] if f"{source}_predictions" in exported
                                else ctx.manifest.output(*RUNGS[source].predictions))
            agreement = float((np.load(predictions) == reference).mean())
            if agreement < cfg.min_top1_agreement:
                raise StageError(
                    f"the FP16 form of {source} agrees with its FP32 form on only {100 * agreement:.1f}% of the test "
                    f"images' top-1 (required {100 * cfg.min_top1_agreement:.1f}%): FP16 overflows or underflows in it",
                    fix=f"leave {rung} out (export.fp16_rungs: [...]) and find the layer with the per-layer profile")
            metrics[rung] = {**facts, "size_mb": path.stat().st_size / 1e6, "scores": scores,
                             "top1_agreement_with_fp32": agreement,
                             "host_note": "ONNX Runtime CPU emulates FP16 (casts around most nodes); the device's "
                                          "figure is the real one"}
            outputs[rung], outputs[f"{rung}_predictions"] = path, predictions
        return outputs

    def summary(self, metrics):
        return ", ".join(f"{rung} {size_text(m['size_mb'])}" + (f" (max |Δ| {m['parity']['max_abs_diff']:.1e})"
                                                             if "parity" in m else
                                                             f" (top-1 {100 * m['scores']['top1']:.2f}%, emulated)")
                         for rung, m in metrics["rungs"].items())

"""quantize stage: INT8 explicit Q/DQ of the student for TensorRT, linted, behind an accuracy gate.

Calibration methods are tried in the recipe's order until the INT8 top-1 (ONNX Runtime on the
test split) is within the budget of the FP32 student; every attempt is recorded. The model that
passes is ``quantize/student.int8.onnx``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import sys
from pathlib import Path

import numpy as np

from device.engine import BuildOptions, trtexec_command
from device.errors import MissingDependencyError, StageError, require
from device.qdq_lint import lint_qdq
from device.registry import Registry
from device.runners.onnxruntime import OnnxRuntimeRunner
from pipeline.stages.base import STAGES, Stage, StageResult
from pipeline.stages.export import INPUT_NAME

QUANTIZERS: Registry = Registry("quantizer")


def run_isolated(function, *args):
    """Runs a quantizer in a fresh (spawned) process.

    ModelOpt patches ONNX Runtime when its ONNX quantizer is imported; afterwards ONNX Runtime's
    own ``quantize_static`` calibrates nothing ("Quantization parameters are not specified for
    param input"). A clean process per attempt keeps the quantizers from seeing each other.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


@QUANTIZERS.register("ort")
def quantize_ort(fp32: Path, out: Path, calibration: np.ndarray, method: str, per_channel: bool) -> None:
    """ONNX Runtime ``quantize_static`` with the options TensorRT accepts.

    Symmetric int8 activations and weights (zero points 0), Q/DQ format, and no bias
    quantization: ORT's default int32 biases in DequantizeLinear are rejected by TensorRT's parser.
    """
    ortq = require("onnxruntime.quantization", "ONNX Runtime", "pip install 'edgefold[device]'")
    CalibrationDataReader, CalibrationMethod = ortq.CalibrationDataReader, ortq.CalibrationMethod
    QuantFormat, QuantType, quantize_static = ortq.QuantFormat, ortq.QuantType, ortq.quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calibration[i : i + 32] for i in range(0, len(calibration), 32))

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {INPUT_NAME: batch}

    methods = {"max": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    with _quiet():
        quantize_static(
            str(fp32), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, calibrate_method=methods[method],
            # Conv and the residual Add: the placement TensorRT recommends; the classifier stays float.
            op_types_to_quantize=["Conv", "Add"],
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False},
        )


@QUANTIZERS.register("modelopt")
def quantize_modelopt(fp32: Path, out: Path, calibration: np.ndarray, method: str, per_channel: bool) -> None:
    """NVIDIA ModelOpt's ONNX PTQ on CPU: Q/DQ where TensorRT wants it (Conv inputs, one input of
    each residual Add), per-channel weights, int8 zero points; weights stored as int8 (``dq_only``)."""
    if method not in ("max", "entropy"):
        raise StageError(f"ModelOpt calibrates with max or entropy, not {method!r}",
                         fix="set quantize.calibration_methods to [max, entropy] for the modelopt quantizer")
    if not per_channel:
        raise StageError("ModelOpt always quantizes weights per channel", fix="set quantize.per_channel: true")
    try:
        from modelopt.onnx.quantization import quantize
    except ImportError as err:
        raise MissingDependencyError(
            f"NVIDIA ModelOpt is not importable ({err})",
            fix="pip install 'edgefold[modelopt]', or set quantize.quantizer: ort (QUANTIZER=ort)",
        ) from None
    with _quiet("modelopt"):
        quantize(str(fp32), quantize_mode="int8", calibration_data=calibration, calibration_method=method,
                 calibration_eps=["cpu"], output_path=str(out), high_precision_dtype="fp32", dq_only=True)


@contextlib.contextmanager
def _quiet(*loggers: str):
    """Silences a quantizer's per-call chatter (histogram sizes, hints) on stdout and the log."""
    saved = {name: logging.getLogger(name).level for name in ("", *loggers)}
    for name in saved:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def quantization_aware_finetune(ctx, workdir: Path, calibration: np.ndarray) -> Path:
    """Fake-quantizes the FP32 student with ModelOpt (INT8, per-channel weights), fine-tunes it with
    the recipe's ``quantize.qat`` schedule and exports the Q/DQ ONNX."""
    import torch
    import torch.nn.functional as F

    from pipeline.checkpoint import load_checkpoint
    from pipeline.models import fold_batchnorm
    from pipeline.stages.export import export_onnx
    from pipeline.train import fit

    try:
        with _quiet("modelopt"):
            import modelopt.torch.quantization as mtq
    except ImportError as err:
        raise MissingDependencyError(f"quantization-aware fine-tuning needs ModelOpt ({err})",
                                     fix="pip install 'edgefold[modelopt]', or set quantize.qat: null") from None
    cfg = ctx.recipe.quantize.qat
    student, _ = load_checkpoint(ctx.manifest.output("distill", "model"))
    model = fold_batchnorm(student)

    def calibrate(module):
        with torch.no_grad():
            for start in range(0, len(calibration), 64):
                module(torch.from_numpy(calibration[start : start + 64]))

    with _quiet("modelopt"):
        model = mtq.quantize(model, mtq.INT8_DEFAULT_CFG, calibrate)
    train = ctx.batches("train", cfg.batch_size, shuffle=True, augment=cfg.augment, seed=cfg.seed, drop_last=True)
    fit(model, train, cfg, lambda logits, batch: F.cross_entropy(logits, batch.labels,
                                                                 label_smoothing=cfg.label_smoothing),
        ctx.device, "qat")
    path = workdir / "student.int8.qat.onnx"
    with _quiet("modelopt"):
        export_onnx(model.cpu().eval(), path, ctx.preprocess.input_shape(1), ctx.recipe.export.opset)
    return path


def onnx_accuracy(path: Path, images: np.ndarray, labels: np.ndarray, batch: int = 250) -> dict[str, float]:
    """Top-1 and top-5 of an ONNX model under ONNX Runtime (which runs Q/DQ models on CPU)."""
    with OnnxRuntimeRunner(path) as runner:
        logits = np.concatenate([runner.infer(images[i : i + batch]) for i in range(0, len(images), batch)])
    top5 = np.argsort(-logits, axis=1)[:, : min(5, logits.shape[1])]
    return {"top1": float((top5[:, 0] == labels).mean()), "top5": float((top5 == labels[:, None]).any(1).mean())}


class QuantizeStage(Stage):
    name = "quantize"

    def needs(self, ctx):
        # Quantization-aware fine-tuning starts from the distilled checkpoint, not from the ONNX.
        return ("data", "export") + (("distill",) if ctx.recipe.quantize.qat else ())

    def config(self, ctx):
        return {"quantize": ctx.recipe.section("quantize"), "calib_size": ctx.recipe.data.calib_size}

    def run(self, ctx, workdir: Path) -> StageResult:
        cfg = ctx.recipe.quantize
        quantize = QUANTIZERS.get(cfg.quantizer)
        fp32 = ctx.manifest.output("export", "student")
        calibration = np.concatenate([x.numpy() for x, *_ in ctx.batches("calib", 256)])
        test_images, test_labels = [], []
        for x, y, *_ in ctx.batches("test", 500):
            test_images.append(x.numpy())
            test_labels.append(y.numpy())
        images, labels = np.concatenate(test_images), np.concatenate(test_labels)
        fp32_top1 = onnx_accuracy(fp32, images, labels)["top1"]
        attempts, accepted = [], None
        plan = [(cfg.quantizer, method) for method in cfg.calibration_methods] + ([("modelopt", "qat")] if cfg.qat else [])
        for quantizer, method in plan:
            candidate = workdir / f"student.int8.{method}.onnx"
            if method == "qat":
                candidate = quantization_aware_finetune(ctx, workdir, calibration)
            else:
                run_isolated(quantize, fp32, candidate, calibration, method, cfg.per_channel)
            lint = lint_qdq(candidate)
            if not lint.ok:
                raise StageError(f"{candidate.name} breaks TensorRT's Q/DQ rules: {lint.describe()}",
                                 fix=f"this is a quantizer bug; try quantize.quantizer other than {cfg.quantizer!r}")
            scores = onnx_accuracy(candidate, images, labels)
            top1 = scores["top1"]
            drop = 100 * (fp32_top1 - top1)
            attempts.append({"quantizer": quantizer, "method": method, **scores, "drop_points": drop,
                             "size_mb": candidate.stat().st_size / 1e6, "lint": lint.to_dict()})
            print(f"quantize: {quantizer}/{method}: INT8 top-1 {100 * top1:.2f}% "
                  f"({-drop:+.2f} points vs FP32 {100 * fp32_top1:.2f}%)", file=sys.stderr)
            if drop <= cfg.accuracy_budget_points:
                accepted = attempts[-1]
                shutil.copyfile(candidate, workdir / "student.int8.onnx")
                break
        if accepted is None:
            table = "\n".join(f"  {a['quantizer']}/{a['method']}: top-1 {100 * a['top1']:.2f}%, "
                              f"drop {a['drop_points']:.2f} points" for a in attempts)
            raise StageError(
                f"INT8 misses the accuracy budget of {cfg.accuracy_budget_points} points (FP32 student "
                f"{100 * fp32_top1:.2f}%):\n{table}" + ("" if cfg.qat else "\n  quantization-aware fine-tuning is off"),
                fix="raise quantize.accuracy_budget_points, add calibration methods, enlarge data.calib_size"
                    + ("" if cfg.qat else ", or set quantize.qat (a short fine-tuning schedule)"),
            )
        chw = ctx.preprocess.input_shape(1)[1:]
        trtexec = {f"tensorrt_{version.split('.')[0]}": " ".join(trtexec_command(
            "student.int8.onnx", "student.int8.plan", INPUT_NAME, chw, BuildOptions(batch=(1, 1, 32)), version))
            for version in ("10.3", "11.0")}
        return StageResult(
            outputs={"student_int8": workdir / "student.int8.onnx"},
            metrics={"fp32_top1": fp32_top1, "top1": accepted["top1"], "top5": accepted["top5"],
                     "drop_points": accepted["drop_points"],
                     "method": accepted["method"], "size_mb": accepted["size_mb"],
                     "fp32_size_mb": fp32.stat().st_size / 1e6, "attempts": attempts, "trtexec": trtexec},
        )

    def summary(self, metrics):
        return (f"INT8 top-1 {100 * metrics['top1']:.2f}% ({-metrics['drop_points']:+.2f} points, {metrics['method']}), "
                f"{metrics['size_mb']:.1f} MB vs {metrics['fp32_size_mb']:.1f} MB FP32")


STAGES.add("quantize", QuantizeStage())

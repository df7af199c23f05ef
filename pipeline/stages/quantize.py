"""quantize stage: INT8 explicit Q/DQ of the student for TensorRT, linted, behind an accuracy gate.

Calibration methods are tried in the recipe's order until the INT8 top-1 (ONNX Runtime on the
test split) is within the budget of the FP32 student; every attempt is recorded. The model that
passes is ``quantize/student.int8.onnx``.
"""

from __future__ import annotations

import os
import shutil
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

from device.engine import trtexec_lines
from device.errors import MissingDependencyError, StageError
from device.qdq_lint import lint_qdq
from device.registry import Registry
from device.runners.onnxruntime import OnnxRuntimeRunner
from pipeline.onnx_scores import onnx_accuracy
from pipeline.scores import points, require_sane
from pipeline.stages.base import STAGES, Stage, StageResult
from pipeline.int8_weights import float_weights
from pipeline.ort_quantize import quantize_ort
from pipeline.ort_quantize import quiet as _quiet
from pipeline.onnx_export import INPUT_NAME
from pipeline.log import log

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


def _logged(log_path: Path, function, *args):
    """Runs ``function`` with the process's stdout and stderr (file descriptors 1 and 2) in ``log_path``.

    ModelOpt's progress bars and ONNX Runtime's C++ warnings bypass Python's streams; only a
    redirection at the descriptor level keeps them out of the run's log. Meant for a spawned child.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log_path, "ab") as log:
        saved = os.dup(1), os.dup(2)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            return function(*args)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def within_budget(fp32_correct: int, int8_correct: int, images: int, budget_points: float) -> bool:
    """Whether the INT8 drop is within the budget, decided on integer counts.

    ``100·(fp32 − int8)/images ≤ budget`` is compared as exact fractions, the budget read from its
    decimal text: in floats one image of 100 is 1.0000000000000009 points and fails a 1.0 budget.
    """
    return Fraction(100 * (fp32_correct - int8_correct)) <= Fraction(str(budget_points)) * images


def store_weights_as_int8(path: Path) -> int:
    """Rewrites ``path`` so that every weight QuantizeLinear → DequantizeLinear pair becomes an int8
    initializer → DequantizeLinear, as TensorRT's QAT workflow and ModelOpt's ``dq_only`` store them.

    The int8 values are exactly what the QuantizeLinear computed at run time (round half to even,
    saturate to [−128, 127], per-tensor or per-channel along its ``axis``), so the model's outputs do
    not change. Returns how many weights were converted.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}

    def value(name: str) -> np.ndarray:
        if name in initializers:
            return numpy_helper.to_array(initializers[name])
        return numpy_helper.to_array(next(a.t for a in constants[name].attribute if a.name == "value"))

    converted, drop = 0, []
    for node in list(graph.node):
        if node.op_type != "QuantizeLinear" or node.input[0] not in initializers:
            continue
        weight = value(node.input[0]).astype(np.float32)
        if weight.ndim < 2:
            continue
        scale = value(node.input[1]).astype(np.float32)
        zero_point = value(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.int8)
        if zero_point.dtype != np.int8:
            continue  # uint8 activations-style quantization is not a TensorRT weight format
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        shape = [1] * weight.ndim
        if scale.ndim:
            shape[axis] = scale.size
        q = np.clip(np.rint(weight / scale.reshape(shape)) + zero_point.reshape(shape if zero_point.ndim else []),
                    -128, 127).astype(np.int8)
        int8_name = f"{node.input[0]}_int8"
        graph.initializer.append(numpy_helper.from_array(q, int8_name))
        for consumer in graph.node:
            for index, name in enumerate(consumer.input):
                if name == node.output[0]:
                    consumer.input[index] = int8_name
        drop.append(node)
        converted += 1
    for node in drop:
        graph.node.remove(node)
    used = {name for n in graph.node for name in n.input}
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return converted


QUANTIZERS.register("ort")(quantize_ort)


def float_islands_to_fp16(path: Path) -> int:
    """Turns the float layers of a Q/DQ model (the islands left out of INT8) into FP16, in place, in the
    pattern ModelOpt writes with ``high_precision_dtype="fp16"``: opset 19, FP16 Q/DQ scales, so each
    DequantizeLinear hands FP16 straight to its Conv/Gemm/Add (no Cast between them to hide the INT8
    pattern from TensorRT's Q/DQ fusion), and the graph's inputs and outputs stay float32.

    onnxconverter-common converts the float layers with the Q/DQ nodes left alone (it would turn their
    scales into Casts of float32 initializers); the scales are then made FP16 here and the Casts it put
    around the Q/DQ nodes removed. Returns how many Q/DQ nodes were made FP16.
    """
    import onnx
    from onnx import numpy_helper, version_converter
    from onnxconverter_common import float16

    model = onnx.load(str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 19:  # FP16 scales on QuantizeLinear/DequantizeLinear arrive with opset 19
        model = version_converter.convert_version(model, 19)
    model = float16.convert_float_to_float16(model, keep_io_types=True,
                                             op_block_list=["QuantizeLinear", "DequantizeLinear"])
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    producers = {out: n for n in graph.node for out in n.output}
    half_scales: dict[str, str] = {}

    def half(name: str) -> str:
        """An FP16 copy of a float32 scale (initializer or Constant), made once per scale."""
        if name not in half_scales:
            if name in initializers:
                value = numpy_helper.to_array(initializers[name])
            else:
                value = numpy_helper.to_array(next(a.t for a in constants[name].attribute if a.name == "value"))
            graph.initializer.append(numpy_helper.from_array(value.astype(np.float16), f"{name}_fp16"))
            half_scales[name] = f"{name}_fp16"
        return half_scales[name]

    def is_cast(node, to: int) -> bool:
        return node is not None and node.op_type == "Cast" and any(a.name == "to" and a.i == to for a in node.attribute)

    def half_scale(node) -> bool:
        scale = node.input[1]
        if scale in producers and is_cast(producers[scale], onnx.TensorProto.FLOAT):
            node.input[1] = producers[scale].input[0]  # the converter's Cast back to float32 of an FP16 scale
        elif scale in initializers or scale in constants:
            node.input[1] = half(scale)
        else:
            return False
        return True

    changed, drop = 0, set()
    for node in [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]:
        if node.op_type == "QuantizeLinear":
            # Q takes its input's type: FP16 only where the converter cast an FP16 island back to float32
            # for it (the graph's float32 input keeps its float32 scale).
            source = producers.get(node.input[0])
            if is_cast(source, onnx.TensorProto.FLOAT) and half_scale(node):
                node.input[0] = source.input[0]
                changed += 1
            continue
        consumers = [c for c in graph.node if node.output[0] in c.input]
        casts = [c for c in consumers if is_cast(c, onnx.TensorProto.FLOAT16)]
        if not casts or len(casts) != len(consumers) or not half_scale(node):
            continue  # feeds a float32 layer (or an output): its scale, and so its output, stays float32
        for cast in casts:
            drop.add(cast.output[0])
            for other in graph.node:
                other.input[:] = [node.output[0] if i == cast.output[0] else i for i in other.input]
        changed += 1
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [n for n in graph.node if not (n.op_type == "Cast" and n.output[0] not in used) and n.output[0] not in drop]
    del graph.node[:]
    graph.node.extend(keep)
    used = {i for n in graph.node for i in n.input}
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)
    # Shapes and types inferred before were the float32 ones: let the checker infer them again.
    del graph.value_info[:]
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return changed


@QUANTIZERS.register("modelopt")
def quantize_modelopt(fp32: Path, out: Path, calibration: np.ndarray, method: str, per_channel: bool,
                      float_islands: str = "fp16") -> None:
    """NVIDIA ModelOpt's ONNX PTQ on CPU: Q/DQ where TensorRT wants it (Conv inputs, one input of
    each residual Add), per-channel weights, int8 zero points; weights stored as int8 (``dq_only``);
    the layers left in float in ``float_islands`` (``high_precision_dtype``; ModelOpt's own default is fp16)."""
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
                 calibration_eps=["cpu"], output_path=str(out), high_precision_dtype=float_islands, dq_only=True)


def quantization_aware_finetune(ctx, workdir: Path, calibration: np.ndarray) -> Path:
    """Fake-quantizes the FP32 student with ModelOpt (INT8, per-channel weights), fine-tunes it with
    the recipe's ``quantize.qat`` schedule and exports a real INT8 Q/DQ ONNX (int8 weights).

    The fine-tuning distils from the FP32 student itself (soft targets at the distillation
    temperature, no labels): QAT is to recover the FP32 model's function under quantization, and
    training on labels would credit INT8 with an extra epoch of ordinary training.
    """
    import torch

    from pipeline.checkpoint import load_checkpoint
    from pipeline.losses import kd_loss
    from pipeline.models import fold_batchnorm
    from pipeline.onnx_export import export_onnx
    from pipeline.train import fit

    try:
        with _quiet("modelopt"):
            import modelopt.torch.quantization as mtq
    except ImportError as err:
        raise MissingDependencyError(f"quantization-aware fine-tuning needs ModelOpt ({err})",
                                     fix="pip install 'edgefold[modelopt]', or set quantize.qat: null") from None
    cfg = ctx.recipe.quantize.qat
    student, _ = load_checkpoint(ctx.manifest.output("distill", "model"))
    reference = student.eval().to(ctx.device)
    model = fold_batchnorm(load_checkpoint(ctx.manifest.output("distill", "model"))[0])

    def calibrate(module):
        with torch.no_grad():
            for start in range(0, len(calibration), 64):
                module(torch.from_numpy(calibration[start : start + 64]))

    with _quiet("modelopt"):
        model = mtq.quantize(model, mtq.INT8_DEFAULT_CFG, calibrate)
    train = ctx.batches("train", cfg.batch_size, shuffle=True, augment=cfg.augment, seed=cfg.seed, drop_last=True)
    temperature = ctx.recipe.distill.temperature

    def loss_fn(logits, batch):
        with torch.no_grad():
            target = reference(batch.x).float()
        return kd_loss(logits, target, batch.labels, temperature, alpha=1.0)

    fit(model, train, cfg, loss_fn, ctx.device, "qat")
    path = workdir / "student.int8.qat.onnx"
    with _quiet("modelopt"):
        export_onnx(model.cpu().eval(), path, ctx.preprocess.input_shape(1), ctx.recipe.export.opset)
    store_weights_as_int8(path)
    return path


class QuantizeStage(Stage):
    name = "quantize"

    def needs(self, ctx):
        # Quantization-aware fine-tuning starts from the distilled checkpoint, not from the ONNX.
        torch_road = "torch_tensorrt" in ctx.recipe.deploy.runtimes
        return ("data", "export") + (("distill",) if ctx.recipe.quantize.qat or torch_road else ())

    def config(self, ctx):
        # The batch sizes shape the recorded trtexec lines (one engine per measured batch).
        return {"quantize": ctx.recipe.section("quantize"), "calib_size": ctx.recipe.data.calib_size,
                "batch_sizes": list(ctx.recipe.deploy.batch_sizes), "runtimes": list(ctx.recipe.deploy.runtimes)}

    def run(self, ctx, workdir: Path) -> StageResult:
        cfg = ctx.recipe.quantize
        quantize = QUANTIZERS.get(cfg.quantizer)
        exported = ctx.manifest.output("export", "student")
        # Quantizers get a copy: ModelOpt's shape inference writes value_info into the file it is given,
        # and the export stage's recorded file must stay what it recorded.
        scratch = workdir / ".scratch"
        scratch.mkdir()
        fp32 = scratch / exported.name
        shutil.copyfile(exported, fp32)
        calibration = np.concatenate([x.numpy() for x, *_ in ctx.batches("calib", 256)])
        test_images, test_labels = [], []
        for x, y, *_ in ctx.batches("test", 500):
            test_images.append(x.numpy())
            test_labels.append(y.numpy())
        images, labels = np.concatenate(test_images), np.concatenate(test_labels)
        reference = onnx_accuracy(fp32, images, labels, save_predictions=workdir / "predictions.fp32.npy")
        attempts, accepted = [], None
        tries = [(cfg.quantizer, method) for method in cfg.calibration_methods] + ([("modelopt", "qat")] if cfg.qat else [])
        for quantizer, method in tries:
            candidate = workdir / f"student.int8.{method}.onnx"
            if method == "qat":
                candidate = quantization_aware_finetune(ctx, workdir, calibration)
            elif quantizer == "modelopt":
                run_isolated(_logged, workdir / "quantizer.log", quantize, fp32, candidate, calibration, method,
                             cfg.per_channel, cfg.float_islands)
            else:
                run_isolated(_logged, workdir / "quantizer.log", quantize, fp32, candidate, calibration, method,
                             cfg.per_channel)
            lint = lint_qdq(candidate)
            if not lint.ok:
                raise StageError(f"{candidate.name} breaks TensorRT's Q/DQ rules: {lint.describe()}",
                                 fix=f"this is a quantizer bug; try quantize.quantizer other than {cfg.quantizer!r}")
            islands = cfg.float_islands if quantizer == "modelopt" and method != "qat" else "fp32"
            if cfg.float_islands == "fp16" and islands == "fp32":
                # One artifact that means the same on TensorRT 10 (FP16 flag) and on strongly typed builds:
                # the layers left out of INT8 are FP16 in the graph, as ModelOpt writes them natively.
                backup = candidate.read_bytes()
                try:
                    float_islands_to_fp16(candidate)
                    islands = "fp16"
                except Exception as err:  # noqa: BLE001 (a graph the rewrite cannot type: keep it, FP32, said so)
                    candidate.write_bytes(backup)
                    islands = f"fp32 (FP16 rewrite failed: {type(err).__name__}: {str(err).splitlines()[0][:160]})"
                    log(f"quantize: {quantizer}/{method}: float islands left FP32: {islands[5:]}")
                lint = lint_qdq(candidate)
                if not lint.ok:
                    raise StageError(f"{candidate.name} with FP16 float islands breaks TensorRT's Q/DQ rules: "
                                     f"{lint.describe()}", fix="set quantize.float_islands: fp32")
            unconverted = float_weights(candidate)
            if unconverted:
                raise StageError(
                    f"{candidate.name} ({quantizer}/{method}) stores {len(unconverted)} quantized weights in float "
                    f"(e.g. {unconverted[0]}): it is {candidate.stat().st_size / 1e6:.2f} MB against "
                    f"{fp32.stat().st_size / 1e6:.2f} MB FP32, not an INT8 artifact",
                    fix="this is a quantizer bug; choose another quantize.quantizer")
            scores = onnx_accuracy(candidate, images, labels,
                                   save_predictions=workdir / f"predictions.{method}.npy")
            drop = 100 * (reference["top1_correct"] - scores["top1_correct"]) / max(scores["images"], 1)
            attempts.append({"quantizer": quantizer, "method": method, "float_islands": islands, **scores,
                             "drop_points": points(drop),
                             "size_mb": candidate.stat().st_size / 1e6, "lint": lint.to_dict()})
            log(f"quantize: {quantizer}/{method}: INT8 top-1 {100 * scores['top1']:.2f}% "
                  f"({points(-drop):+.2f} points vs FP32 {100 * reference['top1']:.2f}%)")
            if within_budget(reference["top1_correct"], scores["top1_correct"], scores["images"],
                             cfg.accuracy_budget_points):
                accepted = attempts[-1]
                shutil.copyfile(candidate, workdir / "student.int8.onnx")
                shutil.copyfile(workdir / f"predictions.{method}.npy", workdir / "predictions.npy")
                break
        shutil.rmtree(scratch)
        if accepted is None:
            table = "\n".join(f"  {a['quantizer']}/{a['method']}: top-1 {100 * a['top1']:.2f}%, "
                              f"drop {a['drop_points']:.2f} points" for a in attempts)
            raise StageError(
                f"INT8 misses the accuracy budget of {cfg.accuracy_budget_points} points (FP32 student "
                f"{100 * reference['top1']:.2f}%):\n{table}" + ("" if cfg.qat else "\n  quantization-aware fine-tuning is off"),
                fix="raise quantize.accuracy_budget_points, add calibration methods, enlarge data.calib_size"
                    + ("" if cfg.qat else ", or set quantize.qat (a short fine-tuning schedule)"),
            )
        sanity = require_sane(
            "the INT8 student", accepted, ctx.dataset().classes,
            causes="a collapsed FP32 student passes the gate with the same score; calibration data that does not "
                   "match the test data",
            fix="check the distill stage's scores; enlarge data.calib_size")
        chw = ctx.preprocess.input_shape(1)[1:]
        # The engines the agent builds: one per measured batch, opt = that batch (one line each).
        trtexec = {f"tensorrt_{version.split('.')[0]}": trtexec_lines(
            "student.int8.onnx", "student.int8", INPUT_NAME, chw, ctx.recipe.deploy.batch_sizes, "int8", version)
            for version in ("10.3", "11.1")}
        scored = ("top1", "top5", "top1_correct", "top5_correct", "images", "predicted_counts", "label_counts")
        outputs = {"student_int8": workdir / "student.int8.onnx", "predictions": workdir / "predictions.npy",
                   "fp32_predictions": workdir / "predictions.fp32.npy"}
        torch_road = None
        if "torch_tensorrt" in ctx.recipe.deploy.runtimes:
            outputs["student_int8_device_checkpoint"], torch_road = self._modelopt_state(ctx, workdir, calibration, images,
                                                                                labels, reference)
        return StageResult(
            outputs=outputs,
            metrics={"fp32_top1": reference["top1"], "fp32_top1_correct": reference["top1_correct"],
                     **{key: accepted[key] for key in scored}, "sanity": sanity,
                     "drop_points": accepted["drop_points"],
                     "method": accepted["method"], "size_mb": accepted["size_mb"],
                     "float_islands": accepted["float_islands"],
                     "fp32_size_mb": exported.stat().st_size / 1e6,
                     "attempts": attempts, "trtexec": trtexec, "torch_road": torch_road},
        )

    @staticmethod
    def _modelopt_state(ctx, workdir: Path, calibration: np.ndarray, images: np.ndarray, labels: np.ndarray,
                        reference: dict) -> tuple[Path, dict]:
        """The Torch-TensorRT road's INT8 rung: ModelOpt's quantizer state calibrated (max) on the same calibration
        images, restored into a fresh student and gated with fake quantization on the same budget as the ONNX road.

        Raises:
            StageError: When the restored, fake-quantized student misses the budget.
        """
        import torch

        from pipeline.modelopt_state import calibrate, restore

        cfg = ctx.recipe.quantize
        checkpoint = ctx.manifest.output("distill", "model")
        path = workdir / "student.int8.device.pt"
        with _quiet("modelopt"):
            record = calibrate(checkpoint, calibration, path, "max", ctx.preprocess.input_shape(1)[1:])
            restored = restore(path)  # what the device does, with the device's code, from the file it gets
        with torch.no_grad():
            predicted = np.concatenate([restored(torch.from_numpy(images[i : i + 256])).argmax(1).numpy()
                                        for i in range(0, len(images), 256)])
        correct = int((predicted == labels).sum())
        drop = 100 * (reference["top1_correct"] - correct) / len(labels)
        gate = {**record, "top1": correct / len(labels), "top1_correct": correct, "drop_points": drop,
                "host_note": "ModelOpt fake quantization on CPU; the device compiles the restored student"}
        if not within_budget(reference["top1_correct"], correct, len(labels), cfg.accuracy_budget_points):
            raise StageError(f"the ModelOpt INT8 student (Torch-TensorRT road, max calibration) drops {drop:.2f} "
                             f"points, over the budget of {cfg.accuracy_budget_points}",
                             fix="raise quantize.accuracy_budget_points, enlarge data.calib_size, or leave "
                                 "torch_tensorrt out of deploy.runtimes")
        return path, gate

    def summary(self, metrics):
        return (f"INT8 top-1 {100 * metrics['top1']:.2f}% ({points(-metrics['drop_points']):+.2f} points, {metrics['method']}), "
                f"{metrics['size_mb']:.1f} MB vs {metrics['fp32_size_mb']:.1f} MB FP32")


STAGES.add("quantize", QuantizeStage())

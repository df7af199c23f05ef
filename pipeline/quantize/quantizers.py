"""The quantizers the INT8 ladder chooses from by key (``quantize.quantizer``), and what every INT8 candidate goes
through whichever task made it: a fresh process per quantizer run, the weights stored as int8, the float islands
written FP16 in the graph, the gate decided on counts. A library (:mod:`pipeline.quantize.ladder` climbs with it).
"""

from __future__ import annotations

import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import Sequence

import numpy as np

from device.errors import MissingDependencyError, StageError
from device.registry import Registry
from pipeline.quantize.ort import quantize_ort
from pipeline.quantize.ort import quiet as _quiet

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


def logged_to(log_path: Path, function, *args):
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

    model = onnx.load(str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 19:  # FP16 scales on QuantizeLinear/DequantizeLinear arrive with opset 19
        model = version_converter.convert_version(model, 19)
    model = _fp16_but_qdq(model)
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


def _fp16_but_qdq(model):
    """onnxconverter-common's FP16 conversion with Q/DQ left float32 (their scales are made FP16 after), then the
    graph's own float32 Casts under FP16 layers made FP16 (:func:`_half_casts_to_float`)."""
    from onnxconverter_common import float16

    blocked = ["QuantizeLinear", "DequantizeLinear"]
    model = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=blocked)
    _half_casts_to_float(model.graph, {*blocked, *float16.DEFAULT_OP_BLOCK_LIST})
    return model


def _half_casts_to_float(graph, float32_ops: set[str]) -> None:
    """Turns FP16 the graph's own ``Cast(to=float32)`` nodes that feed converted layers: onnxconverter-common leaves
    them as they were, so an attention's scale (Shape → Cast → Sqrt → Div → Cast → Sqrt → Mul, as torch exports
    ``scaled_dot_product_attention``) stays float32 while the Mul reading it became FP16, and type inference refuses
    the graph. A Cast feeding an op kept in float32 (Q/DQ, the converter's block list), another Cast (the
    converter's own, in front of a Q/DQ scale) or a graph output stays."""
    import onnx

    outputs = {o.name for o in graph.output}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for node in graph.node:
        if node.op_type != "Cast" or node.output[0] in outputs or not readers.get(node.output[0]):
            continue
        attribute = next(a for a in node.attribute if a.name == "to")
        if attribute.i == onnx.TensorProto.FLOAT and not any(r.op_type in float32_ops or r.op_type == "Cast"
                                                             for r in readers[node.output[0]]):
            attribute.i = onnx.TensorProto.FLOAT16


@QUANTIZERS.register("modelopt")
def quantize_modelopt(fp32: Path, out: Path, calibration: np.ndarray, method: str, per_channel: bool,
                      float_islands: str = "fp16", nodes_to_exclude: Sequence[str] = ()) -> None:
    """NVIDIA ModelOpt's ONNX PTQ on CPU: Q/DQ where TensorRT wants it (Conv inputs, one input of
    each residual Add), per-channel weights, int8 zero points; weights stored as int8 (``dq_only``);
    the layers left in float in ``float_islands`` (``high_precision_dtype``; ModelOpt's own default is fp16).

    Args:
        nodes_to_exclude: Node names left out of Q/DQ (a detector's box-regression branch); ModelOpt reads each as a
            regular expression, so they are escaped.
    """
    import re

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
                 calibration_eps=["cpu"], output_path=str(out), high_precision_dtype=float_islands, dq_only=True,
                 nodes_to_exclude=[f"^{re.escape(name)}$" for name in nodes_to_exclude] or None)

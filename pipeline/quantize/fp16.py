"""FP16 ONNX with float32 inputs and outputs, for the FP16 rung and for FP16 float islands.

Two converters are known: NVIDIA ModelOpt's AutoCast (``modelopt.onnx.autocast.convert_to_mixed_precision``)
and onnxconverter-common's ``float16.convert_float_to_float16``. Both keep the graph's inputs and outputs
float32 (``keep_io_types``) with a Cast behind the input and before the output, so the client, the
preprocessing and the agent's runners see the same tensors as for the FP32 model.
bench/fp16_converters.py compares them; the result (bench/results/fp16-converters-*.md) chose the default.
Neither package is imported until a conversion runs: both come with the ``modelopt`` extra.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import Any

from device.errors import ConfigError, MissingDependencyError, StageError

AUTOCAST = "autocast"
ONNXCONVERTER = "onnxconverter-common"
CONVERTERS = (AUTOCAST, ONNXCONVERTER)
# bench/results/fp16-converters-20261201.md: the same logits on every model measured, and where values pass
# FP16's 65504 AutoCast keeps that layer in FP32; onnxconverter-common types it FP16 (inf on an FP16 engine).
DEFAULT_CONVERTER = AUTOCAST
_INSTALL = "pip install 'edgefold[modelopt]' (it brings nvidia-modelopt and onnxconverter-common)"
_FLOAT = 1  # onnx.TensorProto.FLOAT, spelled out so that importing this module needs no onnx


@contextlib.contextmanager
def quiet():
    # AutoCast logs every step at INFO on its own handler, and onnxconverter-common warns once per
    # truncated weight: a conversion inside a stage would bury the stage's own lines.
    loggers = [logging.getLogger(name) for name in ("modelopt", "modelopt.onnx", "modelopt.onnx.autocast")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _convert(src: Path, converter: str, calibration=None):
    if converter == AUTOCAST:
        try:
            from modelopt.onnx.autocast import convert_to_mixed_precision
        except ImportError as err:
            raise MissingDependencyError(f"NVIDIA ModelOpt's AutoCast is not importable ({err})",
                                         fix=f"{_INSTALL}, or pass converter={ONNXCONVERTER!r}") from None
        # The reference run that picks which nodes stay FP32 (values above data_max=512, where FP16's step is 0.5)
        # feeds random inputs in [-1, 1] unless given images: a LayerNorm's or Softmax's input that only real
        # images drive past FP16's range is found with the calibration slice. providers is passed because
        # AutoCast appends to its default list.
        if calibration is None:
            return convert_to_mixed_precision(str(src), low_precision_type="fp16", keep_io_types=True,
                                              providers=["cpu"])
        import tempfile

        import numpy as np
        import onnx

        name = onnx.load(str(src), load_external_data=False).graph.input[0].name
        with tempfile.TemporaryDirectory() as tmp:
            np.savez(Path(tmp) / "calibration.npz", **{name: np.ascontiguousarray(calibration, dtype=np.float32)})
            return convert_to_mixed_precision(str(src), low_precision_type="fp16", keep_io_types=True,
                                              providers=["cpu"], calibration_data=str(Path(tmp) / "calibration.npz"))
    try:
        from onnxconverter_common import float16
    except ImportError as err:
        raise MissingDependencyError(f"onnxconverter-common is not importable ({err})",
                                     fix=f"{_INSTALL}, or pass converter={AUTOCAST!r}") from None
    import onnx

    return float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)


def graph_facts(model) -> dict[str, int]:
    """Counts in an ONNX graph: ``casts``, ``nodes``, and ``fp32_nodes`` (nodes other than Cast with a
    float32 output, after ONNX type inference: what still computes in FP32), named in ``fp32_node_names``."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {value.name: value.type.tensor_type.elem_type
             for value in list(graph.value_info) + list(graph.input) + list(graph.output)}
    types.update({init.name: init.data_type for init in graph.initializer})
    nodes = list(graph.node)
    fp32 = [f"{node.name or node.output[0]} ({node.op_type})" for node in nodes
            if node.op_type != "Cast" and any(types.get(out) == _FLOAT for out in node.output)]
    return {"casts": sum(node.op_type == "Cast" for node in nodes), "nodes": len(nodes),
            "fp32_nodes": len(fp32), "fp32_node_names": fp32}


def to_fp16(src: Path, dst: Path, converter: str = DEFAULT_CONVERTER, calibration=None) -> dict[str, Any]:
    """Writes ``src`` (an FP32 ONNX model) converted to FP16 at ``dst``, its inputs and outputs float32.

    Args:
        src: The FP32 model.
        dst: Where the FP16 model goes (overwritten).
        converter: ``autocast`` (NVIDIA ModelOpt) or ``onnxconverter-common``.
        calibration: Preprocessed images (N×C×H×W float32, the calibration slice) whose activations decide
            which layers stay FP32 (AutoCast only; onnxconverter-common converts every layer it can), and on which
            the FP16 outputs are compared with the FP32 ones.

    Returns:
        ``converter``, ``casts_inserted`` (Casts added), ``fp32_nodes_left`` (nodes other than Cast still
        computing in FP32: those a converter kept for range or could not convert), ``fp32_nodes`` (the first 20
        of them named, with their op), ``size_mb``, and with ``calibration`` the ``calibration_parity`` of FP16
        against FP32 on those images (:func:`output_parity`).

    Raises:
        ConfigError: An unknown converter.
        MissingDependencyError: The converter's package is not installed.
        StageError: The converted graph fails the ONNX checker or its inputs/outputs are not float32.
    """
    import onnx

    if converter not in CONVERTERS:
        raise ConfigError(f"unknown FP16 converter {converter!r}", fix=f"use one of {', '.join(CONVERTERS)}")
    src, dst = Path(src), Path(dst)
    before = graph_facts(onnx.load(str(src)))
    with quiet():
        model = _convert(src, converter, calibration if converter == AUTOCAST else None)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        raise StageError(f"{converter} made an invalid ONNX graph from {src.name}: {str(err).splitlines()[0]}",
                         fix=f"try converter={next(c for c in CONVERTERS if c != converter)!r}") from None
    io_types = {value.name: value.type.tensor_type.elem_type for value in list(model.graph.input)
                + list(model.graph.output)}
    changed = sorted(name for name, elem in io_types.items() if elem != _FLOAT)
    if changed:
        # keep_io_types was asked for: a float16 input would change what the client sends.
        raise StageError(f"{converter} left {', '.join(changed)} of {src.name} not float32",
                         fix=f"try converter={next(c for c in CONVERTERS if c != converter)!r}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))
    after = graph_facts(model)
    facts = {"converter": converter, "casts_inserted": after["casts"] - before["casts"],
             "fp32_nodes_left": after["fp32_nodes"], "fp32_nodes": after["fp32_node_names"][:20],
             "size_mb": dst.stat().st_size / 1e6}
    if calibration is not None:
        facts["calibration_parity"] = output_parity(src, dst, calibration)
    return facts


def output_parity(reference: Path, candidate: Path, images) -> dict[str, Any]:
    """How far ``candidate``'s outputs (an FP16 form) are from ``reference``'s (its FP32 model) on ``images``, both
    run by ONNX Runtime: ``images``, ``max_abs_diff``, ``max_relative_diff`` (to the largest reference value),
    ``nonfinite`` (outputs that are inf or NaN: an FP16 overflow) and ``top1_agreement``."""
    import numpy as np
    import onnxruntime as ort

    def outputs(path: Path):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return np.concatenate([session.run(None, {name: images[i:i + 64]})[0] for i in range(0, len(images), 64)])

    images = np.ascontiguousarray(images, dtype=np.float32)
    want, got = outputs(reference), outputs(candidate).astype(np.float32)
    finite = np.isfinite(got)
    diff = np.abs(np.where(finite, got, 0.0) - want)
    scale = float(np.abs(want).max()) or 1.0
    return {"images": int(len(images)), "max_abs_diff": float(diff.max()), "max_relative_diff": float(diff.max()) / scale,
            "nonfinite": int((~finite).sum()),
            "top1_agreement": float((got.reshape(len(got), -1).argmax(1) == want.reshape(len(want), -1).argmax(1)).mean())}

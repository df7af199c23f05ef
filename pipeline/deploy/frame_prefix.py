"""The preprocessing written into the graph: a camera frame's uint8 pixels in, the network's input out.

:func:`prefix_graph` writes :class:`device.preprocess.Preprocess` for one frame size and format as ONNX — Cast,
the colour conversion (NV12 → RGB; BGR's channel order), Resize of the shorter side, the centre crop (Slice), the
grey conversion for a one-channel model, the normalization — and :func:`write_prefixed` puts it in front of a rung's
ONNX, so TensorRT or ONNX Runtime runs it with the network (the ``in-graph`` form the agent times beside the CPU
path, :mod:`device.jobs.frame`).

OpenCV resizes and converts colour in fixed point and rounds to uint8 at each step; ONNX works in float. The prefix
rounds where OpenCV does, and what is left differs by at most :func:`tolerance` of the 0–255 scale
per interpolation (:data:`MEASURED_LEVELS`, checked in ``tests/pipeline/test_frame_prefix.py``). OpenCV's ``area``
interpolation (a box filter when shrinking) has no ONNX ``Resize`` mode that matches it: refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from device.errors import ConfigError
from device.jobs.frame_schema import PREFIX_NODES, FrameSpec
from device.preprocess import Preprocess

FRAME_INPUT = "frame"
# The largest difference from the CPU path measured on real and synthetic frames (1920×1080, 640×480, 100×60; RGB
# and grey models), in levels of the 0–255 scale before normalization: nearest neighbour picks the same pixels (a grey
# model's conversion rounds once more); bilinear and bicubic differ by OpenCV's fixed-point weights; NV12's conversion
# adds its own rounding. The tolerance is that plus one level of margin.
MEASURED_LEVELS = {"nearest": 1.0, "bilinear": 1.0}
NV12_EXTRA_LEVELS = 1.0
MARGIN_LEVELS = 1.0
# OpenCV's NV12 → RGB (ITU-R BT.601, video range; modules/imgproc/src/color_yuv.simd.hpp), as floats.
_YUV_TO_RGB = np.array([[1.164, 0.0, 1.596], [1.164, -0.391, -0.813], [1.164, 2.018, 0.0]], dtype=np.float32)
_GREY = (0.299, 0.587, 0.114)  # cv2.COLOR_RGB2GRAY's weights
REFUSED = {"area": "has no ONNX Resize mode that matches OpenCV's (its box filter when shrinking)",
           "bilinear_antialias": "needs ONNX Resize's antialias (opset 18), which onnx-tensorrt's operator table "
                                 "says TensorRT does not support",
           "bicubic": "is a cubic Resize, which TensorRT 10's ONNX parser does not build (nearest and linear only)"}
_RESIZE = {"bilinear": {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
           "nearest": {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}}
# Nearest neighbour is written as two Gathers of OpenCV's own source indices: ONNX Resize divides by a float32 scale
# and lands one pixel off wherever OpenCV's double-precision source coordinate is a whole number (480 → 256 rows).


def tolerance(preprocess: Preprocess, spec: FrameSpec) -> float:
    """The largest difference from the CPU path the prefix may have, in the network's (normalized) units."""
    levels = (MEASURED_LEVELS[preprocess.interpolation] + (NV12_EXTRA_LEVELS if spec.format == "nv12" else 0.0)
              + MARGIN_LEVELS)
    return levels / 255.0 / min(preprocess.std)


def refusal(preprocess: Preprocess) -> str | None:
    """Why this preprocessing cannot be written into the graph, or None."""
    if preprocess.interpolation in REFUSED:
        return (f"interpolation {preprocess.interpolation!r} {REFUSED[preprocess.interpolation]}; the in-graph form "
                f"takes {sorted(_RESIZE)}")
    return None


def resized_size(preprocess: Preprocess, height: int, width: int) -> tuple[int, int]:
    """The frame's size after the shorter-side resize, as :meth:`Preprocess.geometry` computes it."""
    scale = preprocess.resize / min(height, width)
    return max(preprocess.resize, round(height * scale)), max(preprocess.resize, round(width * scale))


class _Graph:
    """Nodes and constants, named in order."""

    def __init__(self, opset: int):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper, self.opset = helper, numpy_helper, opset
        self.nodes, self.initializers, self.count = [], [], 0

    def const(self, value, dtype=np.int64) -> str:
        self.count += 1
        name = f"{PREFIX_NODES}const{self.count}"
        self.initializers.append(self.numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, kind: str, inputs: list[str], output: str | None = None, **attributes) -> str:
        self.count += 1
        output = output or f"{PREFIX_NODES}{kind.lower()}{self.count}"
        self.nodes.append(self.helper.make_node(kind, inputs, [output], name=f"{PREFIX_NODES}{kind}{self.count}",
                                                **attributes))
        return output

    def to_uint8_range(self, tensor: str) -> str:
        """Saturated and rounded as OpenCV's uint8 result is (round half to even; OpenCV rounds half away, a
        difference of one level at exact halves, inside the tolerance)."""
        return self.op("Round", [self.op("Clip", [tensor, self.const(0.0, np.float32), self.const(255.0, np.float32)])])

    def resize(self, tensor: str, size: tuple[int, int], how: dict, source: tuple[int, int] | None = None) -> str:
        """NCHW ``tensor`` resized to ``size`` (H, W), the batch and channels kept (sizes from its own shape); nearest
        neighbour from ``source`` (H, W) by OpenCV's indices (``floor(x · (1 / (dst / src)))`` in double)."""
        if how["mode"] == "nearest" and source is not None:
            for axis, (dst, src) in ((2, (size[0], source[0])), (3, (size[1], source[1]))):
                picked = np.minimum(np.floor(np.arange(dst) * (1.0 / (dst / src))), src - 1)
                tensor = self.op("Gather", [tensor, self.const(picked.astype(np.int64))], axis=axis)
            return tensor
        leading = self.op("Slice", [self.op("Shape", [tensor]), self.const([0]), self.const([2])])
        sizes = self.op("Concat", [leading, self.const(list(size))], axis=0)
        return self.op("Resize", [tensor, "", "", sizes], **how)


def prefix_graph(preprocess: Preprocess, spec: FrameSpec, opset: int = 17):
    """The preprocessing for ``spec``'s frames as an ONNX model: input ``frame`` (uint8 N×H×W×3 BGR for ``bgr`` and
    ``jpeg`` — JPEG is decoded on the CPU first — or N×(H·3/2)×W NV12), output ``input`` (float32 N×C×S×S).

    Raises:
        ConfigError: An interpolation the graph cannot match.
    """
    from onnx import TensorProto, helper

    why = refusal(preprocess)
    if why:
        raise ConfigError(f"the preprocessing cannot be written into the graph: {why}",
                          fix="set preprocess interpolation to bilinear, or deploy.frame.in_graph: false")
    g = _Graph(opset)
    height, width = spec.height, spec.width
    if spec.format == "nv12":
        shape = ["batch", height * 3 // 2, width]
        pixels = g.op("Cast", [FRAME_INPUT], to=TensorProto.FLOAT)
        luma = g.op("Unsqueeze", [g.op("Slice", [pixels, g.const([0]), g.const([height]), g.const([1])]),
                                  g.const([1])])
        chroma = g.op("Slice", [pixels, g.const([height]), g.const([height * 3 // 2]), g.const([1])])
        chroma = g.op("Reshape", [chroma, g.const([0, height // 2, width // 2, 2])])
        chroma = g.op("Transpose", [chroma], perm=[0, 3, 1, 2])  # N×2×H/2×W/2: U, V
        chroma = g.resize(chroma, (height, width), _RESIZE["nearest"])  # each sample serves its 2×2 block
        luma = g.op("Relu", [g.op("Sub", [luma, g.const(16.0, np.float32)])])
        yuv = g.op("Concat", [luma, g.op("Sub", [chroma, g.const(128.0, np.float32)])], axis=1)
        rgb = g.to_uint8_range(g.op("Conv", [yuv, g.const(_YUV_TO_RGB[:, :, None, None], np.float32)]))
        order = "rgb"
    else:
        shape = ["batch", height, width, 3]
        rgb = g.op("Transpose", [g.op("Cast", [FRAME_INPUT], to=TensorProto.FLOAT)], perm=[0, 3, 1, 2])
        order = "bgr"
    size = resized_size(preprocess, height, width)
    resized = rgb if size == (height, width) else g.to_uint8_range(
        g.resize(rgb, size, _RESIZE[preprocess.interpolation], source=(height, width)))
    top, left, side = (size[0] - preprocess.input_size) // 2, (size[1] - preprocess.input_size) // 2, preprocess.input_size
    cropped = g.op("Slice", [resized, g.const([top, left]), g.const([top + side, left + side]), g.const([2, 3])])
    # The frame's order to the model's; a grey model's conversion weighs RGB.
    if order != (preprocess.channel_order if preprocess.channels == 3 else "rgb"):
        cropped = g.op("Gather", [cropped, g.const([2, 1, 0])], axis=1)
    if preprocess.channels == 1:
        cropped = g.to_uint8_range(g.op("Conv", [cropped, g.const(np.array(_GREY).reshape(1, 3, 1, 1), np.float32)]))
    scaled = g.op("Div", [cropped, g.const(255.0, np.float32)])
    centred = g.op("Sub", [scaled, g.const(np.array(preprocess.mean).reshape(1, -1, 1, 1), np.float32)])
    g.op("Div", [centred, g.const(np.array(preprocess.std).reshape(1, -1, 1, 1), np.float32)], output="input")
    graph = helper.make_graph(
        g.nodes, "frame_prefix", [helper.make_tensor_value_info(FRAME_INPUT, TensorProto.UINT8, shape)],
        [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                       ["batch", preprocess.channels, preprocess.input_size, preprocess.input_size])],
        g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="edgefold")


def write_prefixed(model_path: str | Path, preprocess: Preprocess, spec: FrameSpec, out: str | Path) -> Path:
    """A rung's ONNX with the prefix in front: input ``frame`` (uint8), its output as before.

    Raises:
        ConfigError: The rung's graph has no single input named ``input`` (the ladder's export names it so), or an
            interpolation the graph cannot match.
    """
    import onnx
    from onnx import compose

    model = onnx.load(str(model_path))
    inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if inputs != ["input"]:
        raise ConfigError(f"{model_path}: the in-graph prefix feeds an input named 'input', the graph has {inputs}",
                          fix="deploy the ladder's own exports (pipeline.export.onnx names the input 'input')")
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 13:
        raise ConfigError(f"{model_path}: opset {opset}; the prefix needs 13 or later",
                          fix="export at opset 13 or later (export.opset)")
    prefix = prefix_graph(preprocess, spec, opset=opset)
    prefix.ir_version = model.ir_version
    merged = compose.merge_models(prefix, model, io_map=[("input", "input")])
    merged.graph.name = model.graph.name
    out = Path(out)
    onnx.save(merged, str(out))
    return out


def check_prefix(preprocess: Preprocess, spec: FrameSpec, frames: int = 2) -> float:
    """The prefix run alone by ONNX Runtime on ``frames`` synthetic frames against the CPU path
    (:class:`device.jobs.frame.FramePath`): its largest difference, in the network's units.

    Raises:
        ConfigError: Over :func:`tolerance`: the in-graph form would not be the model's preprocessing.
    """
    import onnxruntime as ort

    from device.jobs.frame import FramePath, synthetic_frames

    session = ort.InferenceSession(prefix_graph(preprocess, spec).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    path = FramePath(None, preprocess, spec)
    worst = 0.0
    for frame in synthetic_frames(spec, frames):
        decoded = path.decode(frame)
        graph_input = decoded if spec.format == "jpeg" else frame
        ours = session.run(None, {FRAME_INPUT: np.ascontiguousarray(graph_input)[None]})[0]
        worst = max(worst, float(np.abs(ours - path.prepare(decoded)).max()))
    if worst > tolerance(preprocess, spec):
        raise ConfigError(f"the preprocessing written into the graph differs from the CPU path by {worst:.4f} (over "
                          f"the tolerance {tolerance(preprocess, spec):.4f}) for {spec.width}×{spec.height} "
                          f"{spec.format}, {preprocess.interpolation}", fix="set deploy.frame.in_graph: false, and "
                                                                             "report this as a bug")
    return worst

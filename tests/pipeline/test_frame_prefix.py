"""The preprocessing written into the graph (:mod:`pipeline.deploy.frame_prefix`) against the CPU path it stands for
(:class:`device.jobs.frame.FramePath`: OpenCV, the project's :class:`device.preprocess.Preprocess`), run by real ONNX
Runtime on a real photograph and on synthetic frames, per interpolation and format; the rung with the prefix in front;
an interpolation that cannot match refused."""

from __future__ import annotations

import itertools

import cv2
import numpy as np
import onnxruntime as ort
import pytest

from device.errors import ConfigError
from device.jobs.frame import FramePath, InGraphPath, synthetic_frames, to_nv12
from device.jobs.frame_schema import FrameSpec
from device.preprocess import Preprocess, read_image
from device.runners import make_runner
from pipeline.deploy.frame_prefix import (MARGIN_LEVELS, MEASURED_LEVELS, NV12_EXTRA_LEVELS, check_prefix, prefix_graph,
                                   tolerance, write_prefixed)
from tests.device.agent_process import tiny_onnx

SMOKE = "device/assets/smoke.png"


def frames_with_a_photograph(spec: FrameSpec) -> list:
    """Two synthetic frames and the smoke photograph scaled to the frame, in the spec's format."""
    photo = cv2.resize(read_image(SMOKE)[:, :, ::-1].copy(), (spec.width, spec.height), interpolation=cv2.INTER_AREA)
    encoded = {"jpeg": lambda: cv2.imencode(".jpg", photo)[1], "nv12": lambda: to_nv12(photo), "bgr": lambda: photo}
    return [*synthetic_frames(spec, 2), encoded[spec.format]()]


def largest_levels(preprocess: Preprocess, spec: FrameSpec) -> float:
    """The prefix's largest difference from the CPU path, in levels of the 0–255 scale."""
    session = ort.InferenceSession(prefix_graph(preprocess, spec).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    cpu = FramePath(None, preprocess, spec)
    worst = 0.0
    for frame in frames_with_a_photograph(spec):
        decoded = cpu.decode(frame)
        ours = session.run(None, {"frame": (decoded if spec.format == "jpeg" else frame)[None]})[0]
        worst = max(worst, float(np.abs(ours - cpu.prepare(decoded)).max()) * 255 * min(preprocess.std))
    return worst


@pytest.mark.parametrize("interpolation, fmt, size, channels", [
    *itertools.product(["bilinear", "nearest"], ["bgr", "nv12", "jpeg"], [(640, 480)], [3]),
    ("bilinear", "bgr", (1920, 1080), 3), ("nearest", "bgr", (1920, 1080), 3), ("bilinear", "nv12", (1280, 720), 1),
    ("nearest", "jpeg", (100, 60), 1), ("bilinear", "bgr", (100, 60), 3),
])
def test_the_prefix_matches_the_cpu_path_within_the_levels_measured(interpolation, fmt, size, channels):
    """The stated figures are what the prefix keeps, not a loose bound: each case stays within the measured levels
    (NV12's extra included), so the tolerance (one level more) is never the only thing that holds."""
    small = size[0] < 200
    preprocess = Preprocess(32 if small else 224, 40 if small else 256, channels,
                            (0.485, 0.456, 0.406)[:channels] if channels == 3 else (0.5,),
                            (0.229, 0.224, 0.225)[:channels] if channels == 3 else (0.25,), interpolation)
    spec = FrameSpec(width=size[0], height=size[1], format=fmt, frames=4)
    measured = MEASURED_LEVELS[interpolation] + (NV12_EXTRA_LEVELS if fmt == "nv12" else 0.0)
    assert largest_levels(preprocess, spec) <= measured + 1e-3
    assert tolerance(preprocess, spec) == pytest.approx((measured + MARGIN_LEVELS) / 255 / min(preprocess.std))
    assert check_prefix(preprocess, spec) <= tolerance(preprocess, spec)


@pytest.mark.parametrize("fmt", ["bgr", "nv12"])
def test_a_bgr_model_gets_its_order_in_the_graph_too(fmt):
    """The frame's order (BGR, or NV12's RGB) turned to a BGR model's: a channel order left out would differ by far
    more than the resize's levels on a photograph."""
    preprocess = Preprocess(32, 40, 3, (0.406, 0.456, 0.485), (0.225, 0.224, 0.229), "bilinear", "bgr")
    spec = FrameSpec(width=100, height=60, format=fmt, frames=4)
    assert check_prefix(preprocess, spec) <= tolerance(preprocess, spec)
    # The graph of the same numbers read as RGB, against the BGR model's CPU path: far off (the fault it guards).
    session = ort.InferenceSession(prefix_graph(Preprocess(32, 40, 3, preprocess.mean, preprocess.std), spec)
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    cpu = FramePath(None, preprocess, spec)
    frame = frames_with_a_photograph(spec)[-1]  # the photograph
    unflipped = session.run(None, {"frame": frame[None]})[0]
    assert float(np.abs(unflipped - cpu.prepare(cpu.decode(frame))).max()) > 10 * tolerance(preprocess, spec)


def test_resize_by_onnx_alone_would_land_a_pixel_off_where_opencv_does_not():
    """Why nearest neighbour is written as Gathers: ONNX Resize's float32 scale misplaces rows for 480 → 256 (the
    row a whole-number source coordinate lands on), by a whole pixel."""
    from pipeline.deploy.frame_prefix import _RESIZE, _Graph
    from onnx import TensorProto, helper

    g = _Graph(17)
    g.resize("x", (256, 341), _RESIZE["nearest"])
    graph = helper.make_graph(g.nodes, "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 480, 640])],
                              [helper.make_tensor_value_info(g.nodes[-1].output[0], TensorProto.FLOAT, None)],
                              g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rows = np.arange(480, dtype=np.float32).reshape(1, 1, 480, 1).repeat(640, axis=3)
    by_onnx = ort.InferenceSession(model.SerializeToString()).run(None, {"x": rows})[0][0, 0, :, 0]
    by_opencv = cv2.resize(rows[0, 0], (341, 256), interpolation=cv2.INTER_NEAREST)[:, 0]
    assert (by_onnx != by_opencv).any()
    assert largest_levels(Preprocess(224, 256, 3, (0.5,) * 3, (0.25,) * 3, "nearest"),
                          FrameSpec(width=640, height=480, frames=4)) == 0.0


@pytest.mark.parametrize("interpolation, said", [("area", "has no ONNX Resize mode that matches OpenCV's"),
                                                 ("bicubic", "is a cubic Resize, which TensorRT 10's ONNX parser does not build")])
def test_an_interpolation_the_graph_cannot_carry_is_refused_with_the_fix(interpolation, said):
    with pytest.raises(ConfigError, match=f"interpolation '{interpolation}' {said}") as err:
        prefix_graph(Preprocess(224, 256, 3, (0.5,) * 3, (0.25,) * 3, interpolation), FrameSpec())
    assert "deploy.frame.in_graph: false" in err.value.fix


@pytest.mark.parametrize("fmt", ["bgr", "nv12", "jpeg"])
def test_the_rung_with_the_prefix_answers_as_the_cpu_path_and_the_rung(tmp_path, fmt):
    """``write_prefixed`` on a real ONNX classifier: a uint8 frame in, the rung's logits out, within what the
    tolerance allows the input to move (the same top-1 on every frame)."""
    preprocess = Preprocess(16, 18, 3, (0.5,) * 3, (0.25,) * 3)
    spec = FrameSpec(width=96, height=64, format=fmt, frames=4)
    rung = tiny_onnx(tmp_path / "rung.onnx")
    prefixed = write_prefixed(rung, preprocess, spec, tmp_path / "frame-rung.onnx")
    with make_runner("onnxruntime", str(rung)) as plain, make_runner("onnxruntime", str(prefixed)) as graph:
        cpu, ours = FramePath(plain, preprocess, spec), InGraphPath(graph, preprocess, spec)
        assert graph.input_dtype == np.uint8
        for frame in frames_with_a_photograph(spec):
            expected = plain.infer(cpu.prepare(cpu.decode(frame)))
            got = graph.infer(ours.prepare(ours.decode(frame)))
            assert got.shape == expected.shape and np.abs(got - expected).max() < 0.05
            assert ours.timed(frame)[1][0] == cpu.timed(frame)[1][0]


def test_a_rung_without_the_ladders_input_name_is_refused(tmp_path):
    import onnx

    model = onnx.load(str(tiny_onnx(tmp_path / "rung.onnx")))
    model.graph.input[0].name = "images"
    model.graph.node[0].input[0] = "images"
    onnx.save(model, tmp_path / "renamed.onnx")
    with pytest.raises(ConfigError, match="feeds an input named 'input', the graph has \\['images'\\]"):
        write_prefixed(tmp_path / "renamed.onnx", Preprocess(16, 18, 3, (0.5,) * 3, (0.25,) * 3), FrameSpec(),
                       tmp_path / "out.onnx")

"""A detector brought as ONNX (recipe ``start: {onnx: path, outputs: yolov8 | yolov5 | end2end}``): the detection
ladder entered at export, the user's graph as the FP32 ``student``.

The three output layouts are Ultralytics' exports:

- ``yolov8`` (YOLOv8, YOLO11): one output ``N×(4 + classes)×A``: boxes as centre x, centre y, width, height in the
  input's pixels, then the class scores already through a sigmoid; no objectness.
- ``yolov5`` (YOLOv5, YOLOv7): one output ``N×A×(5 + classes)``: the box as above, an objectness score, the class
  probabilities.
- ``end2end`` (``end2end=True``, YOLOv10, YOLO26): one output ``N×D×6``: x1, y1, x2, y2, score, class, the
  detections already chosen (no NMS after the graph).

The graph is checked before any stage runs (:func:`inspect_detection_start`) and written in the ladder's form: opset
≥ 13, the input named ``input`` with a free batch, the output ``head``; its sidecar says how
:mod:`device.scoring.detection_post` decodes it. The box branch INT8 leaves in FP16 is found from the graph
(:func:`pipeline.tasks.detection.box_branch.traced_box_branch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device.errors import ConfigError
from device.scoring.detection_post import SCHEMA, head_spec_from_dict
from pipeline.export.onnx_start import (LADDER_OPSET, PARSED_OPSETS, check_image_input, check_ops, graph_opset,
                                        batch_disagreement, load_graph, one_at_a_time, opened_for_ladder,
                                        refuse_start, renamed_to_ladder, run_graph, set_shape, start_sha256,
                                        with_free_batch)

OUTPUT_LAYOUTS = ("yolov8", "yolov5", "end2end")
# The post-processing an application runs, as each family's own predictor sets it: Ultralytics'
# (ultralytics/cfg/default.yaml: conf 0.25 when predicting, iou 0.7, max_det 300; non_max_suppression's max_nms
# 30000) and YOLOv5's detect.py (conf 0.25, iou 0.45, max_det 1000).
_ULTRALYTICS = {"score_threshold": 0.25, "iou_threshold": 0.7, "max_detections": 300, "topk_candidates": 30000}
YOLO_POSTPROCESS = {"yolov8": _ULTRALYTICS, "end2end": _ULTRALYTICS,
                    "yolov5": {**_ULTRALYTICS, "iou_threshold": 0.45, "max_detections": 1000}}
EXPORT_HINTS = {
    "yolov8": "export it again with Ultralytics: yolo export model=best.pt format=onnx dynamic=True opset=17",
    "end2end": "export it again with Ultralytics: yolo export model=best.pt format=onnx dynamic=True opset=17 (an "
               "end-to-end model writes its final detections)",
    "yolov5": "export it again from the YOLOv5 repository: python export.py --weights best.pt --include onnx --dynamic "
              "(YOLOX: tools/export_onnx.py --decode_in_inference)"}
_FIXED = {  # layout → (columns before the classes, the output is N×K×A)
    "yolov8": (4, True), "yolov5": (5, False), "end2end": (None, False)}


@dataclass(frozen=True)
class DetectionStartFacts:
    """What the checks found in the user's detector (recorded in the export stage's metrics)."""

    path: str
    sha256: str
    opset: int
    outputs: str
    input_name: str
    input_shape: list[Any]
    output_name: str
    output_shape: list[int]
    classes: int
    rows: int
    nodes: int
    size: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _layout_of(shape: tuple[int, ...], classes: int) -> str | None:
    """The layout a raw output of ``shape`` (batch first) looks like for ``classes`` classes, or None."""
    if len(shape) != 3:
        return None
    if shape[1] == 4 + classes and shape[2] != 4 + classes:
        return "yolov8"
    if shape[2] == 5 + classes:
        return "yolov5"
    return "end2end" if shape[2] == 6 else None


def _checked_output(path: Path, outputs: str, got: np.ndarray, classes: int) -> int:
    """The rows (boxes per image) of the output ``got`` read as ``outputs``.

    Raises:
        ConfigError: The output does not have that layout for the data's classes (the layout it looks like named).
    """
    shape = tuple(got.shape)
    columns, transposed = _FIXED[outputs]
    width = shape[1] if transposed else shape[-1]
    expected = 6 if outputs == "end2end" else columns + classes
    if len(shape) != 3 or width != expected:
        guess = _layout_of(shape, classes)
        wanted = {"yolov8": f"N×{expected}×A", "yolov5": f"N×A×{expected}", "end2end": "N×D×6"}[outputs]
        hint = f"it looks like start.outputs: {guess}; " if guess and guess != outputs else ""
        raise refuse_start(path, f"output is {list(shape)}; start.outputs {outputs} with the data's {classes} "
                                 f"classes is {wanted}",
                           hint + "name the layout your exporter wrote, and DATA= with the classes the model was "
                                  "trained on, in its class order")
    rows = shape[2] if transposed else shape[1]
    rows_of = got.transpose(0, 2, 1) if transposed else got
    if outputs == "end2end":
        _check_final(path, rows_of, classes)
    else:
        _check_decoded(path, outputs, rows_of)
    return int(rows)


def _check_decoded(path: Path, outputs: str, rows: np.ndarray) -> None:
    """A raw YOLO output as its predictor reads it: class scores (and objectness) already probabilities, boxes
    already decoded to centres across the input and sizes that are not negative.

    Raises:
        ConfigError: Logits, or boxes still in the head's own terms (YOLOX's export without its decode: grid offsets
            and log sizes).
    """
    scores = rows[..., 4:]
    if scores.size and (scores.min() < -1e-4 or scores.max() > 1 + 1e-4):
        raise refuse_start(path, f"class scores range over [{scores.min():.3g}, {scores.max():.3g}]; a {outputs} "
                                 "export's scores are probabilities in [0, 1] (after the sigmoid)",
                           "export the model's inference form (the head's decode and sigmoid in the graph): "
                           + EXPORT_HINTS[outputs])
    centres, sizes = rows[..., 0:2], rows[..., 2:4]
    if rows.size and (sizes.min() < -1e-3 or centres.max() < 2.0):
        raise refuse_start(path, f"boxes are not decoded to input pixels (centres up to {centres.max():.3g}, sizes "
                                 f"down to {sizes.min():.3g}): the graph ends before the head's decode",
                           EXPORT_HINTS[outputs])


def _check_final(path: Path, rows: np.ndarray, classes: int) -> None:
    """An end-to-end output's class column holds class indices; a one-class YOLOv5 export (N×A×6 too) holds
    probabilities there.

    Raises:
        ConfigError: Not class indices of the data's classes (yolov5 named when the shape fits it).
    """
    labels = rows[..., 5]
    if labels.size and (np.abs(labels - np.rint(labels)).max() > 1e-3 or labels.min() < 0 or labels.max() >= classes):
        hint = "it looks like start.outputs: yolov5 (a one-class YOLOv5 export is N×A×6 too); " if classes == 1 else ""
        raise refuse_start(path, f"column 5 of the output holds values from {labels.min():.3g} to {labels.max():.3g}, "
                                 f"not indices of the data's {classes} classes: not an end-to-end output",
                           hint + "name the layout your exporter wrote")


def inspect_detection_start(path: str | Path, outputs: str, size: int | None, classes: int) -> DetectionStartFacts:
    """Every check of a starting detector that needs no earlier stage: the file, its opset and operators, one
    square RGB input (of ``size``: the graph's own where it fixes one, else the recipe's ``data.canvas.size``), one
    output of the declared layout for ``classes``, a batch answered image by image.

    Raises:
        ConfigError: What is wrong with the file, and how to fix it.
    """
    return _checked(Path(path), outputs, size, classes)[0]


def input_size(path: str | Path) -> int | None:
    """The square side the graph's input fixes, or None (a free size, or no readable graph: the preflight says)."""
    try:
        import onnx

        graph = onnx.load(str(path), load_external_data=False).graph
        initialisers = {t.name for t in graph.initializer}
        image = next(i for i in graph.input if i.name not in initialisers)
        dims = [d.dim_value if d.HasField("dim_value") else None for d in image.type.tensor_type.shape.dim]
    except Exception:  # reported by the preflight, with the file's hash
        return None
    return dims[2] if len(dims) == 4 and isinstance(dims[2], int) and dims[2] == dims[3] else None


def _checked(path: Path, outputs: str, size: int | None, classes: int) -> tuple[DetectionStartFacts, bytes, list[str]]:
    model = load_graph(path)
    opset = graph_opset(model)
    if not PARSED_OPSETS[0] <= opset <= PARSED_OPSETS[1]:
        raise refuse_start(path, f"is opset {opset}; TensorRT 10's ONNX parser imports opsets "
                                 f"{PARSED_OPSETS[0]}–{PARSED_OPSETS[1]}", EXPORT_HINTS[outputs])
    check_ops(path, model)
    own = input_size(path)
    size = own or size
    if size is None:
        raise refuse_start(path, "leaves its height and width free and no size was given",
                           "set the size it was trained at: SET='data.canvas.size=640'")
    image, dims = check_image_input(path, model, "nchw", 3, size)
    if len(model.graph.output) != 1:
        raise refuse_start(path, f"has {len(model.graph.output)} outputs "
                                 f"({', '.join(o.name for o in model.graph.output)}); the detection start reads one",
                           "export the one raw (or end-to-end) output; a segmentation or pose export's extra "
                           "outputs are not read")
    got = run_graph(path, np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32))
    rows = _checked_output(path, outputs, got, classes)
    out = model.graph.output[0]
    facts = DetectionStartFacts(str(path), start_sha256(path), opset, outputs, image.name, dims, out.name,
                                list(got.shape[1:]), classes, rows, len(model.graph.node), size)
    return (facts, *_ladder_form(facts, size, free=own is None))


def _ladder_form(facts: DetectionStartFacts, size: int, free: bool = False) -> tuple[bytes, list[str]]:
    """The user's detector in the ladder's form, serialized, and what was changed in words: opset ≥ 13, the input
    ``input`` with a free batch at ``size`` (``free``: the graph left height and width free, as Ultralytics'
    ``dynamic=True`` does), the output ``head``, every node named (the quantizer leaves nodes out by name); a batch
    of 3 answered as each image alone (a static export's batch widened first).

    Raises:
        ConfigError: The graph cannot be converted, or answers a batch otherwise than image by image.
    """
    from pipeline.tasks.detection.export import OUTPUT_NAME

    path = Path(facts.path)
    model, changes = opened_for_ladder(path, facts.opset, EXPORT_HINTS[facts.outputs])
    graph = model.graph
    renamed_to_ladder(model, facts.input_name, facts.output_name, False, output_as=OUTPUT_NAME)
    unnamed = [node for node in graph.node if not node.name]
    for index, node in enumerate(unnamed):
        node.name = f"edgefold_{node.op_type}_{index}"
    if unnamed:
        changes.append(f"{len(unnamed)} unnamed node(s) named")
    set_shape(graph.input[0], ("batch", 3, size, size))
    set_shape(graph.output[0], ("batch", *facts.output_shape))
    if free:
        changes.append(f"height and width fixed at {size} px (free in the graph: data.canvas.size)")
    if facts.input_shape[0] == 1:
        changes.append("batch made dynamic (it was 1)")
    example = np.random.default_rng(1).random((3, 3, size, size), dtype=np.float32)
    data = with_free_batch(model, path, example, facts.output_shape, facts.input_shape[0] == 1,
                           EXPORT_HINTS[facts.outputs], changes,
                           explain=lambda batched, alone: batch_refusal(path, facts.outputs, batched, alone, "random"))
    return data, changes


def batch_refusal(path: Path, outputs: str, batched: np.ndarray, alone: np.ndarray,
                  images: str = "the run's test") -> ConfigError | None:
    """The refusal of a graph whose answers to a batch of real images differ from its answers to each image alone
    (Ultralytics 8.4's ``nms=True`` export answers only the first image of a batch), or None when they agree."""
    differ = batch_disagreement(batched, alone)
    if not differ:
        return None
    if outputs == "end2end":
        found = lambda rows: ", ".join(str(int((image[:, 4] > 0).sum())) for image in rows[:8])  # noqa: E731
        said = (f"at a batch of {len(alone)} it answers {len(differ)} image(s) otherwise than alone (detections per "
                f"image: {found(batched)} in the batch; {found(alone)} one at a time)")
        fix = ("export it without nms=True, as the raw head (EdgeFold's device post-processing runs the NMS as "
               "Ultralytics' predict does): yolo export model=best.pt format=onnx dynamic=True; then MODEL=best.onnx")
    else:
        said = (f"at a batch of {len(alone)} it answers image(s) {', '.join(str(i + 1) for i in differ[:8])} "
                "otherwise than each image alone")
        fix = "export with a dynamic batch: " + EXPORT_HINTS[outputs]
    return refuse_start(path, said + f" (checked on {images} images)", fix)


def start_sidecar(facts: DetectionStartFacts, size: int, postprocess: dict[str, Any] | None = None,
                  channel_order: str = "rgb", input_range: str = "0-1") -> dict[str, Any]:
    """The decoding sidecar of a started detector: its layout, score and box kinds, its feed (channel order, input
    range), Ultralytics' letterbox and thresholds (the recipe's ``postprocess`` keys that are set win).

    Raises:
        HeadSpecError: The sidecar does not decode (checked as the device will check it).
    """
    from pipeline.tasks.detection.export import INPUT_NAME, OUTPUT_NAME

    classes = facts.classes
    if facts.outputs == "end2end":
        layout = {"bbox_regression": [0, 4], "scores": [4, 5], "labels": [5, 6]}
        score, candidates, coder = "final", "final", {"kind": "xyxy"}
    elif facts.outputs == "yolov5":
        layout = {"bbox_regression": [0, 4], "objectness": [4, 5], "cls_logits": [5, 5 + classes]}
        score, candidates, coder = "objectness", "per_box", {"kind": "cxcywh"}
    else:
        layout = {"bbox_regression": [0, 4], "cls_logits": [4, 4 + classes]}
        score, candidates, coder = "probability", "per_box", {"kind": "cxcywh"}
    sidecar = {
        "schema": SCHEMA, "arch": f"onnx:{Path(facts.path).name}", "outputs": facts.outputs,
        "input": INPUT_NAME, "output": OUTPUT_NAME, "input_shape": [3, size, size], "image_size": [size, size],
        "input_note": f"{channel_order.upper()} in [{input_range.replace('-', ', ')}], letterboxed as Ultralytics does "
                      "(aspect kept, centred, grey 114 padding); no normalisation (YOLO's graphs take the image as "
                      "it is)",
        "channel_order": channel_order, "input_range": input_range,
        "mean": [0.0, 0.0, 0.0], "std": [1 / 255 if input_range == "0-255" else 1.0] * 3, "num_classes": classes,
        "label_offset": 0,
        "layout": layout, "score": score, "box_coder": coder, "candidates": candidates, "anchors": [],
        "anchors_per_level": [], "rows": facts.rows, "transpose": facts.outputs == "yolov8", "resize": "letterbox",
        "postprocess": {**YOLO_POSTPROCESS[facts.outputs],
                        **{k: v for k, v in (postprocess or {}).items() if v is not None}},
    }
    head_spec_from_dict(sidecar, f"the sidecar of {Path(facts.path).name}")
    return sidecar


def write_detection_start(path: str | Path, outputs: str, size: int | None, classes: int, out: Path,
                          postprocess: dict[str, Any] | None = None, **feed: str
                          ) -> tuple[DetectionStartFacts, dict[str, Any]]:
    """Checks the file again (it may have changed since the preflight), writes its ladder form to ``out`` and the
    sidecar beside it.

    Args:
        feed: ``channel_order`` and ``input_range`` (:func:`start_sidecar`), recorded in the sidecar.

    Returns:
        The file's facts, and what was written: the changes in words, opset, nodes, size, the box branch's nodes.
    """
    import json

    import onnx

    from pipeline.tasks.detection.box_branch import traced_box_branch
    from pipeline.tasks.detection.export import sidecar_path

    facts, data, changes = _checked(Path(path), outputs, size, classes)
    out.write_bytes(data)
    size = facts.size
    sidecar_path(out).write_text(json.dumps(start_sidecar(facts, size, postprocess, **feed)) + "\n")
    model = onnx.load_from_string(data)
    return facts, {"changes": changes, "opset": max(facts.opset, LADDER_OPSET), "nodes": len(model.graph.node),
                   "size_mb": len(data) / 1e6, "box_branch_nodes": len(traced_box_branch(model, outputs != "yolov8")),
                   "sidecar": sidecar_path(out).name}

"""A YOLO-layout detector's box branch found from its ONNX graph: the nodes INT8 leaves in FP16.

Where the box columns and the score columns of the output are concatenated (YOLOv8's ``cat(dbox, cls.sigmoid())``,
YOLOv5's ``cat(xy, wh, conf)`` per level, an end-to-end ``cat(boxes, score, class)``), the box branch is every node
whose values only the box columns depend on. A library of the detection task: the export module asks it for a
started graph's branch (:func:`pipeline.tasks.detection.export.box_branch_nodes`).
"""

from __future__ import annotations

import numpy as np


WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm")
"""The operators that carry a layer's weights: a box branch without one is only the indexing after the boxes were
made (an end-to-end head's gather of the chosen boxes)."""


def traced_box_branch(model, columns_last: bool) -> list[str]:
    """The nodes only the box columns of a YOLO-layout output depend on.

    Walking back from the output, each Concat whose leading inputs make exactly the four box columns along the
    columns' axis (YOLOv8's ``cat(dbox, cls.sigmoid())``; YOLOv5's ``cat(xy, wh, conf)`` per level; an end-to-end
    ``cat(boxes, score, class)``) splits the graph: the box branch is every node the box inputs depend on and the
    score inputs do not. The walk stops at such a Concat when its branch holds a weighted layer; otherwise it goes on
    past it (an end-to-end head gathers boxes made earlier, at YOLOv8's Concat along axis 1).

    Args:
        columns_last: The output's columns are its last axis (``N×A×K``); False for YOLOv8's ``N×K×A``.

    Returns:
        The box branch's node names, in graph order (empty where no such Concat is found).
    """
    graph = model.graph
    shapes = _concat_shapes(model)
    producer = {out: node for node in graph.node for out in node.output}
    found, fallback, seen, queue = set(), set(), set(), [graph.output[0].name]
    while queue:
        node = producer.get(queue.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        split = _box_split(node, shapes, columns_last) if node.op_type == "Concat" else None
        branch = _ancestors(split[0], producer) - _ancestors(split[1], producer) if split else set()
        if branch and _ops(branch, graph) & set(WEIGHTED):
            found |= branch
            continue
        fallback |= branch
        queue.extend(node.input)
    chosen = found or fallback
    return [node.name for node in graph.node if node.name in chosen]


def _ops(names: set[str], graph) -> set[str]:
    return {node.op_type for node in graph.node if node.name in names}


def _concat_shapes(model) -> dict[str, list[int]]:
    """The shape of every Concat's inputs on one zero image."""
    from pipeline.export.onnx_start import probed_shapes

    names = {name for node in model.graph.node if node.op_type == "Concat" for name in node.input if name}
    dims = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    return probed_shapes(model, sorted(names), np.zeros(dims, np.float32))


def _box_split(node, shapes: dict, columns_last: bool) -> tuple[list[str], list[str]] | None:
    """(box inputs, score inputs) of a Concat along the column axis whose leading inputs are four columns. A
    Concat of vectors (a shape being computed) is never one."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    dims = [shapes.get(name) for name in node.input]
    if not dims or any(not d for d in dims) or len(dims[0]) < 3:
        return None
    rank = len(dims[0])
    axis = axis % rank
    # The output's column axis; inside an end-to-end head (columns last) also YOLOv8's N×K×A Concat, along axis 1.
    if axis not in ((rank - 1, 1) if columns_last and rank == 3 else (rank - 1,) if columns_last else (1,)):
        return None
    sizes = [d[axis] for d in dims]
    total = 0
    for index, width in enumerate(sizes):
        if not isinstance(width, int):
            return None
        total += width
        if total == 4:
            rest = list(node.input[index + 1:])
            return (list(node.input[:index + 1]), rest) if rest else None
        if total > 4:
            return None
    return None


def _ancestors(names: list[str], producer: dict) -> set[str]:
    """The names of every node whose values the tensors ``names`` are computed from: a ``Shape`` or ``Size`` reads
    only its input's dimensions, so the walk does not go past one (torchvision's heads reshape the centerness by
    the box regression's shape; that shares no value)."""
    found, queue = set(), list(names)
    while queue:
        node = producer.get(queue.pop())
        if node is None or node.name in found:
            continue
        found.add(node.name)
        if node.op_type not in ("Shape", "Size"):
            queue.extend(node.input)
    return found

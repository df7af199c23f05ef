"""Named nodes of an ONNX graph rewritten to FP16, with a Cast at each edge of the set and nothing else touched.

:mod:`pipeline.quantize.fp16` converts a whole graph (its float remainder, for FP16 islands); a detector's box
branch needs less: only its own nodes in FP16, the class tower beside it left as it was (measured: the class tower's
GroupNorm in FP16 moving tiny-det's INT8 mAP from 17.1 to 7.6). The converters' block lists work the other way
round (everything but the listed nodes), so this is a small rewrite of its own:

* a float32 tensor entering the set from outside gets one ``Cast(to=FLOAT16)``, shared by every node of the set
  that reads it;
* a float32 tensor the set produces for a reader outside it (or for the graph's output) keeps its name and
  type through a ``Cast(to=FLOAT)`` after the set, so the rest of the graph, its inputs and outputs are unchanged;
* the set's own float weights and ``Constant`` values are stored as float16 (a weight shared with a node outside
  the set gets a float16 copy), and a ``Cast(to=FLOAT)`` inside the set now casts to FLOAT16.

TensorRT's strongly typed build (10.12+, and 11) takes these types as written; ONNX Runtime's CPU provider runs an
FP16 node with no FP16 kernel by casting around it (its InsertCastTransformer), so the host scores what the device
builds, up to the kernels' accumulation.
"""

from __future__ import annotations

from typing import Any, Iterable

from device.errors import StageError

_FLOAT, _FLOAT16 = 1, 10  # onnx.TensorProto.FLOAT and FLOAT16, spelled out: reading them needs no onnx import


def _float_tensors(model) -> set[str]:
    """Names of the float32 values in ``model`` (inputs, outputs, initializers and inferred intermediates)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    graph = inferred.graph
    floats = {v.name for v in list(graph.value_info) + list(graph.input) + list(graph.output)
              if v.type.tensor_type.elem_type == _FLOAT}
    return floats | {init.name for init in graph.initializer if init.data_type == _FLOAT}


def _to_float16(tensor):
    """A float32 TensorProto as float16 under the same name (values rounded to nearest)."""
    import numpy as np
    from onnx import numpy_helper

    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name)


def nodes_to_fp16(model, names: Iterable[str]) -> dict[str, Any]:
    """Rewrites the nodes called ``names`` in ``model`` (an ``onnx.ModelProto``, changed in place) to FP16.

    Args:
        model: The graph; its inputs and outputs keep their types.
        names: The nodes to compute in FP16 (a detector's box branch: :func:`pipeline.tasks.detection.export.box_branch_nodes`).

    Returns:
        ``fp16_nodes`` (nodes of the set with a float16 output), ``casts_in``/``casts_out`` (Casts added at the
        set's edges) and ``weights_fp16`` (initializers and Constants stored as float16).

    Raises:
        StageError: A name is not a node of the graph (the set would silently shrink), or the rewritten graph fails
            ONNX's checker or type inference.
    """
    import onnx
    from onnx import helper

    wanted = set(names)
    graph = model.graph
    present = {node.name for node in graph.node}
    missing = sorted(wanted - present)
    if missing:
        raise StageError(f"{len(missing)} node(s) to put in FP16 are not in the graph (e.g. {missing[0]})",
                         fix="this is a bug in the node selection; report it with the ONNX")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    wanted -= {node.name for node in graph.node if node.name in wanted and not _takes_float16(node, opset)}
    floats = _float_tensors(model)
    inside = [node for node in graph.node if node.name in wanted]
    produced_inside = {out for node in inside for out in node.output}
    outside_readers = {name for node in graph.node if node.name not in wanted for name in node.input}
    outside_readers |= {value.name for value in graph.output}
    initializers = {init.name: init for init in graph.initializer}
    readers_of = {}
    for node in graph.node:
        for name in node.input:
            readers_of.setdefault(name, set()).add(node.name in wanted)

    casts_before, renamed_outputs, weights = {}, {}, 0
    for node in inside:
        weights += _attributes_to_float16(node)
        for position, name in enumerate(node.input):
            if not name or name not in floats or name in produced_inside:
                continue
            if node.op_type in _READS_ONLY_DIMENSIONS:  # a Shape of a feature map: casting it would copy it whole
                continue
            if name in initializers:
                if readers_of[name] == {True}:  # read only inside the set: stored as float16 in place
                    initializers[name].CopyFrom(_to_float16(initializers[name]))
                    floats.discard(name)
                    weights += 1
                    continue
                copy = f"{name}_fp16"  # shared with a float reader: that one keeps its float32 weight
                if copy not in initializers:
                    initializers[copy] = _to_float16(initializers[name])
                    initializers[copy].name = copy
                    graph.initializer.append(initializers[copy])
                    weights += 1
                node.input[position] = copy
                continue
            if name not in casts_before:
                casts_before[name] = helper.make_node("Cast", [name], [f"{name}_fp16"], to=_FLOAT16,
                                                      name=f"{name}_CastToFp16")
            node.input[position] = casts_before[name].output[0]
        for position, name in enumerate(node.output):
            if name in floats and name in outside_readers:
                renamed_outputs[name] = f"{name}_fp16"
                node.output[position] = renamed_outputs[name]
    # Readers inside the set of a renamed output read the float16 tensor directly.
    for node in inside:
        for position, name in enumerate(node.input):
            if name in renamed_outputs:
                node.input[position] = renamed_outputs[name]
    casts_after = [helper.make_node("Cast", [fp16], [name], to=_FLOAT, name=f"{name}_CastToFp32")
                   for name, fp16 in renamed_outputs.items()]
    ordered = _topological([*casts_before.values(), *graph.node, *casts_after],
                           {v.name for v in graph.input} | set(initializers))
    del graph.node[:]
    graph.node.extend(ordered)
    del graph.value_info[:]  # stale float32 annotations of the rewritten tensors; inference writes them anew
    _cast_float32_left_inside(model, wanted)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as err:  # onnx raises ValidationError and shape-inference errors
        raise StageError(f"the FP16 rewrite made an invalid ONNX graph: {str(err).splitlines()[0]}",
                         fix="this is a bug in pipeline/quantize/fp16_nodes.py; report it with the ONNX") from None
    fp16_outputs = _float16_producers(model)
    return {"fp16_nodes": len(fp16_outputs & wanted), "casts_in": len(casts_before), "casts_out": len(casts_after),
            "weights_fp16": weights}


_READS_ONLY_DIMENSIONS = ("Shape", "Size")


def _takes_float16(node, opset: int) -> bool:
    """Whether ONNX lets the operator compute in float16: a ``Range`` does not (its values stay float32, and Casts
    at the set's edge carry them in and out, as for any node outside it)."""
    import onnx

    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except Exception:  # noqa: BLE001 (an operator ONNX does not know: the checker after the rewrite says so)
        return True
    for constraint in schema.type_constraints:
        allowed = set(constraint.allowed_type_strs)
        if "tensor(float)" in allowed and "tensor(float16)" not in allowed:
            return False
    return True


def _attributes_to_float16(node) -> int:
    """Float32 values a node of the set makes from its attributes, made float16: a ``Constant``'s value (tensor or
    scalar), a ``ConstantOfShape``'s fill (Ultralytics' strides are ``ConstantOfShape`` of the anchors' count, filled
    with the stride; unset, it fills float32 zeros), a ``Cast`` to float. Returns how many values were stored."""
    from onnx import helper

    changed = 0
    for attr in node.attribute:
        if node.op_type in ("Constant", "ConstantOfShape") and attr.name == "value" and attr.t.data_type == _FLOAT:
            attr.t.CopyFrom(_to_float16(attr.t))
            changed += 1
        elif node.op_type == "Cast" and attr.name == "to" and attr.i == _FLOAT:
            attr.i = _FLOAT16
    if node.op_type == "Constant" and any(a.name in ("value_float", "value_floats") for a in node.attribute):
        import numpy as np
        from onnx import numpy_helper

        attr = next(a for a in node.attribute if a.name in ("value_float", "value_floats"))
        values = np.asarray(attr.f if attr.name == "value_float" else list(attr.floats), np.float16)
        node.attribute.remove(attr)
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(values)))
        changed += 1
    if node.op_type == "ConstantOfShape" and not any(a.name == "value" for a in node.attribute):
        import numpy as np
        from onnx import numpy_helper

        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, np.float16))))
        changed += 1
    return changed


def _cast_float32_left_inside(model, wanted: set[str]) -> None:
    """A Cast to float16 after every float32 value the set still makes for a reader in the set: an operator whose
    output type follows no input (a ``RandomNormal``, an ``EyeLike`` …) cannot be rewritten by its attributes, and a
    float32 value meeting a float16 one at a ``Mul`` makes an invalid graph. Readers outside the set keep the
    float32 value."""
    import onnx
    from onnx import helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 (the checker after the rewrite reports an unreadable graph)
        return
    float32 = {v.name for v in inferred.value_info if v.type.tensor_type.elem_type == _FLOAT}
    graph = model.graph
    made = {out: node for node in graph.node if node.name in wanted for out in node.output}
    added = {}
    for node in graph.node:
        if node.name not in wanted or node.op_type in _READS_ONLY_DIMENSIONS:
            continue
        for position, name in enumerate(node.input):
            if name in made and name in float32 and not name.endswith("_fp16"):
                if name not in added:
                    added[name] = helper.make_node("Cast", [name], [f"{name}_as_fp16"], to=_FLOAT16,
                                                   name=f"{name}_CastToFp16")
                node.input[position] = added[name].output[0]
    if added:
        ordered = _topological([*graph.node, *added.values()],
                               {v.name for v in graph.input} | {t.name for t in graph.initializer})
        del graph.node[:]
        graph.node.extend(ordered)


def _topological(nodes: list, available: set[str]) -> list:
    """``nodes`` in an order where each runs after the producers of its inputs (ONNX requires it), otherwise as
    given: Kahn's algorithm, taking the earliest ready node each time."""
    import heapq

    producer = {out: i for i, node in enumerate(nodes) for out in node.output}
    waiting, readers = [0] * len(nodes), {}
    for i, node in enumerate(nodes):
        needs = {producer[name] for name in node.input if name and name not in available and name in producer}
        waiting[i] = len(needs)
        for j in needs:
            readers.setdefault(j, []).append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in readers.get(i, ()):
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise StageError("the FP16 rewrite left a cycle in the graph",
                         fix="this is a bug in pipeline/quantize/fp16_nodes.py; report it with the ONNX")
    return order


def _float16_producers(model) -> set[str]:
    """Names of the nodes (other than Cast) with a float16 output, after type inference."""
    import onnx

    graph = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    halves = {v.name for v in list(graph.value_info) + list(graph.output) if v.type.tensor_type.elem_type == _FLOAT16}
    return {node.name for node in graph.node if node.op_type != "Cast" and halves.intersection(node.output)}


def fp16_nodes(model) -> set[str]:
    """Names of the nodes of ``model`` that compute in FP16 (a float16 output; Casts left out)."""
    return _float16_producers(model)

"""Tensors of an ONNX graph marked as extra outputs: what a debug job (``JobSpec.diverge``) returns, and what the build
host compares them with.

ONNX Runtime returns only graph outputs, so the graph is copied with the marked tensors appended to its outputs
(Polygraphy's ``--onnx-outputs mark``); TensorRT marks them on the parsed network (``INetworkDefinition.mark_output``,
in :func:`device.runners.engine.build_engine`). Either way the names are the ONNX graph's own, checked here first so that a
name not in the graph fails before any engine is built, with the names it may have meant.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable, Sequence

from device.errors import ConfigError


class TensorNotFoundError(ConfigError):
    """A tensor name that no node of the graph writes."""


def produced(model) -> dict[str, str]:
    """Every tensor a node of ``model`` writes → that node's name (``op_index`` for an unnamed node), in graph order."""
    found: dict[str, str] = {}
    for index, node in enumerate(model.graph.node):
        for output in node.output:
            if output:
                found.setdefault(output, node.name or f"{node.op_type}_{index}")
    return found


def check_names(names: Iterable[str], available: Sequence[str], where: str) -> None:
    """Raises :class:`TensorNotFoundError` naming each name not in ``available`` and the closest ones that are."""
    missing = [name for name in names if name not in set(available)]
    if not missing:
        return
    hints = []
    for name in missing[:5]:
        close = difflib.get_close_matches(name, available, n=3, cutoff=0.5)
        hints.append(f"{name!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
    raise TensorNotFoundError(
        f"{len(missing)} tensor name(s) not written by any node of {where}: {'; '.join(hints)}"
        + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
        fix="name tensors of this rung's own graph (edgefold diverge picks them itself; "
            "python -c 'import onnx; print([o for n in onnx.load(PATH).graph.node for o in n.output])' lists them)")


def with_outputs(path: str | Path, names: Sequence[str]) -> bytes:
    """``path``'s model, serialized, with ``names`` appended to its graph outputs (each once, float32 or as inferred).

    Raises:
        TensorNotFoundError: A name no node writes.
    """
    import onnx

    model = onnx.load(str(path))
    check_names(names, list(produced(model)), Path(path).name)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        types = {info.name: info.type.tensor_type.elem_type for info in inferred.graph.value_info}
    except Exception:  # noqa: BLE001 (inference is a nicety: ONNX Runtime fills an unset shape itself)
        types = {}
    present = {output.name for output in model.graph.output}
    for name in names:
        if name not in present:
            model.graph.output.append(onnx.helper.make_tensor_value_info(
                name, types.get(name) or onnx.TensorProto.FLOAT, None))
    return model.SerializeToString()

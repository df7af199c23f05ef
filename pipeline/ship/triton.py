"""A Triton model repository for a shipped rung: the device's TensorRT plan (``tensorrt_plan``) and the ONNX for a
CPU or data-center server (``onnxruntime_onnx``), each with its ``config.pbtxt`` (Triton's ``ModelConfig`` in
protobuf text format: model_config.proto).

A plan loads only in a Triton built on the TensorRT that built it, on the GPU of the fingerprint it was built for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# ONNX TensorProto element type → Triton's DataType name (model_config.proto); a type Triton has no name for
# (the FP8 and 4-bit kinds) is refused, never guessed.
_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16", 6: "TYPE_INT32",
          7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64", 12: "TYPE_UINT32",
          13: "TYPE_UINT64", 16: "TYPE_BF16"}


def io_facts(onnx_path: Path) -> dict[str, list[dict[str, Any]]]:
    """The graph's inputs and outputs: name, Triton data type, ``shape`` (every axis, -1 where named or unknown),
    ``dims`` (without the batch axis) and ``batch_dynamic`` (whether the batch axis is free).

    Raises:
        ValueError: A tensor type Triton cannot declare.
    """
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}

    def facts(values) -> list[dict[str, Any]]:
        found = []
        for value in values:
            if value.name in initializers:
                continue
            tensor = value.type.tensor_type
            if tensor.elem_type not in _TYPES:
                raise ValueError(f"{value.name} is of ONNX type {onnx.TensorProto.DataType.Name(tensor.elem_type)}, "
                                 "which Triton's model configuration has no type for")
            shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
            found.append({"name": value.name, "data_type": _TYPES[tensor.elem_type], "shape": shape,
                          "dims": shape[1:], "batch_dynamic": bool(shape) and shape[0] == -1})
        return found

    return {"inputs": facts(graph.input), "outputs": facts(graph.output)}


def config_pbtxt(name: str, platform: str, max_batch_size: int, io: dict[str, list[dict[str, Any]]]) -> str:
    """``config.pbtxt`` of one model: with ``max_batch_size`` 0 every tensor is declared with all its axes (the
    model's batch is its own), else without the batch axis Triton adds."""
    def tensors(kind: str, values: list[dict[str, Any]]) -> list[str]:
        lines = [f"{kind} ["]
        for index, value in enumerate(values):
            comma = "," if index < len(values) - 1 else ""
            dims = value["shape"] if max_batch_size == 0 else value["dims"]
            lines += ["  {", f'    name: "{value["name"]}"', f"    data_type: {value['data_type']}",
                      f"    dims: [ {', '.join(str(d) for d in dims)} ]", "  }" + comma]
        return lines + ["]"]

    lines = [f'name: "{name}"', f'platform: "{platform}"', f"max_batch_size: {max_batch_size}"]
    lines += tensors("input", io["inputs"]) + tensors("output", io["outputs"])
    # A plan runs on a GPU; ONNX Runtime's backend takes the GPU where the server has one, else the CPU.
    lines.append(f"instance_group [ {{ count: 1, kind: {'KIND_GPU' if platform == 'tensorrt_plan' else 'KIND_AUTO'} }} ]")
    return "\n".join(lines) + "\n"


def _fixed(io: dict[str, list[dict[str, Any]]], batch: int) -> dict[str, list[dict[str, Any]]]:
    """The tensors of an engine built for one batch: that batch in every free leading axis."""
    def at(value: dict[str, Any]) -> dict[str, Any]:
        shape = [batch if value["batch_dynamic"] else value["shape"][0], *value["shape"][1:]]
        return {**value, "shape": shape}
    return {kind: [at(value) for value in values] for kind, values in io.items()}


def write_repository(folder: Path, name: str, onnx_path: Path, engine: Path | None, engine_batch: int,
                     onnx_batch: int) -> list[str]:
    """``triton/<name>/`` (the plan, when there is one) and ``triton/<name>_onnx/``; returns the models written.

    EdgeFold's engines are built for one batch (min = opt = max), so the plan's model declares its tensors whole with
    ``max_batch_size: 0``; the ONNX model batches up to ``onnx_batch`` when its batch axis is free, else likewise.
    """
    import shutil

    io = io_facts(onnx_path)
    onnx_free = all(value["batch_dynamic"] for value in io["inputs"] + io["outputs"])
    written = []
    for model, platform, source, filename, batch, tensors in (
            (name, "tensorrt_plan", engine, "model.plan", 0, _fixed(io, engine_batch)),
            (f"{name}_onnx", "onnxruntime_onnx", onnx_path, "model.onnx", onnx_batch if onnx_free else 0, io)):
        if source is None:
            continue
        (folder / model / "1").mkdir(parents=True)
        shutil.copyfile(source, folder / model / "1" / filename)
        (folder / model / "config.pbtxt").write_text(config_pbtxt(model, platform, batch, tensors))
        written.append(model)
    return written

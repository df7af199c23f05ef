"""A Triton model repository for a shipped rung: the device's TensorRT plan (``tensorrt_plan``) and the ONNX for a
CPU or data-center server (``onnxruntime_onnx``), each with its ``config.pbtxt`` (Triton's ``ModelConfig`` in
protobuf text format: model_config.proto).

A plan loads only in a Triton built on the TensorRT that built it, on the GPU of the fingerprint it was built for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# ONNX TensorProto element type → Triton's DataType name (model_config.proto).
_TYPES = {1: "TYPE_FP32", 10: "TYPE_FP16", 11: "TYPE_FP64", 2: "TYPE_UINT8", 3: "TYPE_INT8", 6: "TYPE_INT32",
          7: "TYPE_INT64", 9: "TYPE_BOOL"}


def io_facts(onnx_path: Path) -> dict[str, list[dict[str, Any]]]:
    """The graph's inputs and outputs: name, Triton data type, dims without the batch axis."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}

    def facts(values) -> list[dict[str, Any]]:
        found = []
        for value in values:
            if value.name in initializers:
                continue
            tensor = value.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim][1:]
            found.append({"name": value.name, "data_type": _TYPES.get(tensor.elem_type, "TYPE_FP32"), "dims": dims})
        return found

    return {"inputs": facts(graph.input), "outputs": facts(graph.output)}


def config_pbtxt(name: str, platform: str, max_batch_size: int, io: dict[str, list[dict[str, Any]]]) -> str:
    """``config.pbtxt`` of one model."""
    def tensors(kind: str, values: list[dict[str, Any]]) -> list[str]:
        lines = [f"{kind} ["]
        for index, value in enumerate(values):
            comma = "," if index < len(values) - 1 else ""
            lines += ["  {", f'    name: "{value["name"]}"', f"    data_type: {value['data_type']}",
                      f"    dims: [ {', '.join(str(d) for d in value['dims'])} ]", "  }" + comma]
        return lines + ["]"]

    lines = [f'name: "{name}"', f'platform: "{platform}"', f"max_batch_size: {max_batch_size}"]
    lines += tensors("input", io["inputs"]) + tensors("output", io["outputs"])
    lines.append("instance_group [ { count: 1, kind: KIND_GPU } ]" if platform == "tensorrt_plan"
                 else "instance_group [ { count: 1, kind: KIND_CPU } ]")
    return "\n".join(lines) + "\n"


def write_repository(folder: Path, name: str, onnx_path: Path, engine: Path | None, engine_batch: int,
                     onnx_batch: int) -> list[str]:
    """``triton/<name>/`` (the plan, when there is one) and ``triton/<name>_onnx/``; returns the models written."""
    import shutil

    io = io_facts(onnx_path)
    written = []
    for model, platform, source, filename, batch in ((name, "tensorrt_plan", engine, "model.plan", engine_batch),
                                                      (f"{name}_onnx", "onnxruntime_onnx", onnx_path, "model.onnx",
                                                       onnx_batch)):
        if source is None:
            continue
        (folder / model / "1").mkdir(parents=True)
        shutil.copyfile(source, folder / model / "1" / filename)
        (folder / model / "config.pbtxt").write_text(config_pbtxt(model, platform, batch, io))
        written.append(model)
    return written

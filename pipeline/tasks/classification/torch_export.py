"""What a rung ships for the Torch-TensorRT road, and their parity checks: the device checkpoint (``.device.pt``:
state and architecture identity, the default: data the device rebuilds a module from), and, for agents that trust
programs, the ``torch.export`` program (``.pt2``).

The agent's ``torch_tensorrt`` runtime compiles either on the device (device/runners/torch_tensorrt.py). A program
records the torch that wrote it (``extra/edgefold.json``) beside torch's own serialization schema version, so a
refusal can name both.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

# The largest batch the exported program admits; the runtime re-exports at each measured batch (static shapes).
MAX_BATCH = 4096


def export_program(model: torch.nn.Module, path: Path, input_shape: tuple[int, ...]) -> dict:
    """Exports ``model`` (eval mode, CPU) with a dynamic batch axis and saves it with the torch version recorded.

    Args:
        model: The rung's float model.
        path: Where to write the ``.pt2``.
        input_shape: (1, C, H, W).

    Returns:
        Facts: the torch version, the serialization schema, the graph's ATen op count, the size.
    """
    from torch._export.serde.schema import SCHEMA_VERSION

    model = model.eval().cpu()
    # An example batch of 2, not 1: torch.export specializes a dimension whose example size is 0 or 1.
    example = torch.zeros((2, *input_shape[1:]))
    program = torch.export.export(model, (example,),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=MAX_BATCH)},))
    record = {"torch": torch.__version__, "schema": f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}"}
    torch.export.save(program, str(path), extra_files={"edgefold.json": json.dumps(record)})
    ops = sum(node.op == "call_function" for node in program.graph.nodes)
    return {**record, "aten_ops": int(ops), "size_mb": path.stat().st_size / 1e6}


def runner_parity(model: torch.nn.Module, path: Path, images: np.ndarray) -> dict:
    """Compares ``model`` with the module the agent's Torch runner loads from ``path``: a device checkpoint rebuilt
    by the device's own loader (registry and identity check included), or a saved program."""
    from device.runners.torch import TorchRunner

    with torch.no_grad():
        reference = model.eval()(torch.from_numpy(images)).numpy()
    with TorchRunner(path, channels_last=False, trust_programs=True) as runner:  # the build host's own file
        got = np.concatenate([runner.infer(images[i : i + 64]) for i in range(0, len(images), 64)])
    diff = np.abs(got - reference)
    return {"images": int(len(images)), "max_abs_diff": float(diff.max()),
            "top1_agreement": float((got.argmax(1) == reference.argmax(1)).mean())}


def write_device_checkpoint(checkpoint: Path, path: Path, input_chw: tuple[int, ...]) -> Path:
    """A float rung's device checkpoint: its checkpoint with ``input_chw`` and its architecture's identity added,
    which the device rebuilds with its own code and exports on its own torch
    (:func:`device.uploads.torch_checkpoint.load_for_export`)."""
    from device.models.architectures import ARCHITECTURES
    from device.files import atomic_writer
    from device.uploads.torch_checkpoint import read_payload

    payload = read_payload(checkpoint)
    with atomic_writer(path) as handle:
        torch.save({**payload, "input_chw": [int(d) for d in input_chw],
                    "architecture": ARCHITECTURES.get(payload["arch"]).identity()}, handle)
    return path


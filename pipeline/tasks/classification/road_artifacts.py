"""What the Torch-TensorRT road sends a device for each rung: the build host's ``torch.export`` program, or the
rung's device checkpoint that the device exports with its own torch (torch-free: the deploy stage imports it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from device.runners.torch_tensorrt import read_program_versions


@dataclass(frozen=True)
class RoadArtifacts:
    """What the Torch-TensorRT road can send for one rung.

    Attributes:
        program: The build host's ``.pt2`` (float rungs), or None (the INT8 rung: ModelOpt's export needs CUDA).
        checkpoint: The rung's device checkpoint (``.device.pt``), which the device exports on its own torch.
    """

    program: Path | None = None
    checkpoint: Path | None = None

    def for_device(self, device_torch: str | None) -> tuple[Path | None, str]:
        """The file to send to a device with torch ``device_torch``, and why that one.

        The program when the device runs the torch release that wrote it (a ``.pt2`` may not load in another:
        serialization schema versions); otherwise the checkpoint, exported on the device with its own torch.
        """
        if self.program is not None:
            wrote = _release(read_program_versions(self.program).torch)
            if wrote is not None and wrote == _release(device_torch):
                return self.program, f"torch.export program (the device's torch {device_torch} is the release that wrote it)"
            if self.checkpoint is None:
                return self.program, (f"torch.export program written by torch {'.'.join(map(str, wrote or ()))} "
                                      f"for a device with torch {device_torch} (no checkpoint to export there)")
        if self.checkpoint is None:
            return None, "no artifact for this rung on the Torch-TensorRT road"
        why = ("device checkpoint: ModelOpt's INT8 export runs on the device, under CUDA" if self.program is None
               else f"device checkpoint: the device's torch {device_torch} is another release than the program's, "
                    "so the device exports it with its own torch")
        return self.checkpoint, why


def _release(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None

"""What the Torch-TensorRT road sends a device for each rung: the rung's device checkpoint (data: the device rebuilds
the module with its own code and exports it with its own torch), or, where the recipe asks for it and the agent
trusts programs, the build host's ``torch.export`` program (torch-free: the deploy stage imports it)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device.runners.torch_tensorrt import read_program_versions


@dataclass(frozen=True)
class RoadArtifacts:
    """What the Torch-TensorRT road can send for one rung.

    Attributes:
        checkpoint: The rung's device checkpoint (``.device.pt``), which the device rebuilds and exports.
        program: The build host's ``.pt2`` (float rungs, ``deploy.torch_programs`` only), or None.
        architecture: The checkpoint's architecture identity (key, source, fingerprint, requirement).
    """

    checkpoint: Path | None = None
    program: Path | None = None
    architecture: dict[str, str] = field(default_factory=dict)

    def for_device(self, info: dict[str, Any]) -> tuple[Path | None, str]:
        """The file to send to a device (its ``GET /v1/device``), and why that one, or (None, why not).

        The device checkpoint, unless the recipe sent a program, the agent trusts programs and runs the torch release
        that wrote it (a ``.pt2`` may not load in another: serialization schema versions). A device that cannot
        rebuild the checkpoint's architecture (its source is not installed there) gets nothing, and the reason names
        the package to install.
        """
        device_torch = info.get("torch")
        if self.program is not None and info.get("trust_programs"):
            wrote = _release(read_program_versions(self.program).torch)
            if wrote is not None and wrote == _release(device_torch):
                return self.program, (f"torch.export program (the agent trusts programs, and its torch {device_torch} "
                                      "is the release that wrote it)")
        if self.checkpoint is None:
            return None, "no artifact for this rung on the Torch-TensorRT road"
        lacking = missing_architecture(self.architecture, info)
        if lacking:
            return None, lacking
        return self.checkpoint, ("device checkpoint: the device rebuilds the module from its own architecture "
                                 "registry and exports it with its own torch")


def missing_architecture(identity: dict[str, str], info: dict[str, Any]) -> str | None:
    """Why the device whose ``GET /v1/device`` is ``info`` cannot rebuild ``identity``'s architecture (naming the
    package to install), or None."""
    if not identity:
        return None
    sources = info.get("architectures")
    key, requirement = identity.get("key"), identity.get("requirement", "")
    install = f"pip install '{requirement}' into the agent's environment on the device and restart it"
    if not isinstance(sources, dict):
        return (f"not sent: the agent does not list the architecture sources it has (an older EdgeFold); "
                f"upgrade it, and make sure it has {requirement} for {key}")
    package, _, version = requirement.partition("==")
    if package == "torchvision" and not sources.get("torchvision"):
        return f"not sent: {key} is built from torchvision, which the device lacks ({install})"
    if key.startswith("timm/") and sources.get("timm") != version:
        have = f"timm {sources['timm']}" if sources.get("timm") else "no timm"
        return f"not sent: {key} needs timm {version} (the build host's) and the device has {have} ({install})"
    if identity.get("source", "").startswith("entry point") and (sources.get("entry_points") or {}).get(key) != requirement:
        have = (sources.get("entry_points") or {}).get(key) or "no such entry point"
        return f"not sent: {key} comes from {requirement} and the device has {have} ({install})"
    return None


def _release(version: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def recorded_architecture(checkpoint: Path) -> dict[str, str]:
    """The architecture identity a device checkpoint records (read with ``torch.load(weights_only=True)``)."""
    from device.uploads.torch_checkpoint import read_payload

    return dict(read_payload(checkpoint).get("architecture") or {})

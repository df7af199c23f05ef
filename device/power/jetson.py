"""What a Jetson is: L4T → JetPack, SoC → CUDA compute capability, and the board's model.

The L4T → JetPack table is jetson-stats 7.2.2's (``jtop/core/jetson_variables.py``
``NVIDIA_JETPACK``) from L4T 32 on: an exact release lookup, never a guess from the prefix (36.4.7
is JetPack 6.2.1, not 6.1; L4T 38 is JetPack 7). A release the table does not know reports no
JetPack rather than a wrong one. Importable without torch or TensorRT (the engine cache and the
device description both use it).
"""

from __future__ import annotations

import json
from pathlib import Path

# The one L4T table (device/l4t.json), shared with docker/platforms.py: the images and the agent agree.
L4T_TABLE = json.loads((Path(__file__).parents[1] / "l4t.json").read_text())
L4T_TO_JETPACK: dict[str, str] = L4T_TABLE["jetpack"]

# Tegra SoC → CUDA compute capability of its integrated GPU (jetson-stats' CUDA_TABLE).
TEGRA_COMPUTE_CAPABILITY = {"tegra264": "11.0", "tegra234": "8.7", "tegra194": "7.2", "tegra186": "6.2",
                            "tegra210": "5.3"}

MODEL_PATHS = ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model")


def jetpack_for(l4t: str | None) -> str | None:
    """The JetPack release of L4T ``l4t`` (``36.4.7`` → ``6.2.1``); None when unknown.

    A two-part release (``32.5``, the old ``REVISION: 5`` form) is read as ``32.5.0``.
    """
    if not l4t:
        return None
    parts = l4t.strip().lstrip("rR").split(".")
    while len(parts) < 3:
        parts.append("0")
    return L4T_TO_JETPACK.get(".".join(parts[:3]))


def board_model(paths: tuple[str, ...] = MODEL_PATHS) -> str | None:
    """The device tree's model string (``NVIDIA Jetson AGX Orin Developer Kit``): the one place that
    tells Orin Nano, Orin NX and AGX Orin apart (their GPU and compute capability are the same)."""
    for path in paths:
        try:
            model = Path(path).read_bytes().rstrip(b"\0").decode(errors="replace").strip()
        except OSError:
            continue
        if model:
            return model
    return None


def module_id(compatible: str = "/proc/device-tree/compatible") -> str | None:
    """The module's part number from the device tree (``p3701-0005`` for a 64 GB AGX Orin)."""
    try:
        entries = Path(compatible).read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    for entry in entries:
        name = entry.split(",", 1)[-1]
        if name.startswith("p") and "-" in name and "+" not in name:
            return name
    return None

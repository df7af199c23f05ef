"""What a Jetson is: L4T → JetPack, SoC → CUDA compute capability, and the board's model.

The L4T → JetPack table is jetson-stats 7.2.2's (``jtop/core/jetson_variables.py``
``NVIDIA_JETPACK``) from L4T 32 on: an exact release lookup, never a guess from the prefix (36.4.7
is JetPack 6.2.1, not 6.1; L4T 38 is JetPack 7). A release the table does not know reports no
JetPack rather than a wrong one. Importable without torch or TensorRT (the engine cache and the
device description both use it).
"""

from __future__ import annotations

from pathlib import Path

L4T_TO_JETPACK = {
    # JetPack 7 (Thor; Orin from 7.2)
    "39.2.2": "7.2.2", "39.2.1": "7.2.1", "39.2.0": "7.2 GA", "39.0.0": "7.2 EA",
    "38.4.0": "7.1", "38.2.2": "7.0", "38.2.1": "7.0", "38.2.0": "7.0",
    # JetPack 6
    "36.5.2": "6.2.3", "36.5.0": "6.2.2", "36.4.7": "6.2.1", "36.4.4": "6.2.1", "36.4.3": "6.2",
    "36.4.2": "6.1 (rev1)", "36.4.0": "6.1", "36.3.0": "6.0", "36.2.0": "6.0 DP", "36.0.0": "6.0 EA",
    # JetPack 5
    "35.6.5": "5.1.7", "35.6.4": "5.1.6", "35.6.3": "5.1.5", "35.6.2": "5.1.5", "35.6.1": "5.1.5",
    "35.6.0": "5.1.4", "35.5.0": "5.1.3", "35.4.1": "5.1.2", "35.3.1": "5.1.1", "35.3.0": "5.1.1 PRE",
    "35.2.1": "5.1", "35.1.0": "5.0.2 GA", "34.1.1": "5.0.1 DP", "34.1.0": "5.0 DP", "34.0.1": "5.0 PRE-DP",
    # JetPack 4
    "32.7.6": "4.6.6", "32.7.5": "4.6.5", "32.7.4": "4.6.4", "32.7.3": "4.6.3", "32.7.2": "4.6.2",
    "32.7.1": "4.6.1", "32.6.1": "4.6", "32.5.2": "4.5.1", "32.5.1": "4.5.1", "32.5.0": "4.5",
    "32.4.4": "4.4.1", "32.4.3": "4.4", "32.4.2": "4.4 DP", "32.3.1": "4.3", "32.2.3": "4.2.3",
    "32.2.1": "4.2.2", "32.2.0": "4.2.1", "32.1.0": "4.2",
}

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

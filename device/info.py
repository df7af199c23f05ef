"""What this device is: board, L4T/JetPack, GPU, runtimes and their versions, power mode.

Versions come from package metadata where possible, so describing the device does not import
torch or TensorRT (seconds of start-up, gigabytes of memory on a small Jetson).
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from device import __version__
from device.engine import detect_gpu, read_l4t
from device.jetson import board_model, jetpack_for, module_id


def package_version(*names: str) -> str | None:
    """The installed version of the first distribution found among ``names``."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cuda_version() -> str | None:
    """The CUDA toolkit's version (``/usr/local/cuda/version.json``), else the driver's through NVML."""
    try:
        return json.loads(Path("/usr/local/cuda/version.json").read_text())["cuda"]["version"]
    except (OSError, ValueError, KeyError):
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        return f"{version // 1000}.{version % 1000 // 10} (driver)"
    except Exception:  # no NVML or no driver
        return None


def power_mode() -> dict[str, Any]:
    """nvpmodel's mode and whether jetson_clocks is on, where those tools exist (a Jetson)."""
    info: dict[str, Any] = {"nvpmodel": None, "jetson_clocks": None}
    if shutil.which("nvpmodel"):
        try:
            out = subprocess.run(["nvpmodel", "-q"], capture_output=True, text=True, timeout=5).stdout
            for line in out.splitlines():
                if line.startswith("NV Power Mode:"):
                    info["nvpmodel"] = line.split(":", 1)[1].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    if shutil.which("jetson_clocks"):
        try:
            out = subprocess.run(["jetson_clocks", "--show"], capture_output=True, text=True, timeout=5).stdout
            # --show prints each CPU's MinFreq and CurrentFreq; jetson_clocks pins min to max.
            pinned = [line for line in out.splitlines() if "MinFreq" in line and "MaxFreq" in line]
            if pinned:
                info["jetson_clocks"] = all(_field(line, "MinFreq") == _field(line, "MaxFreq") for line in pinned)
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def _field(line: str, name: str) -> str | None:
    for part in line.split():
        if part.startswith(f"{name}="):
            return part.split("=", 1)[1]
    return None


def describe_device() -> dict[str, Any]:
    """Board, L4T/JetPack, GPU, CUDA, runtimes (TensorRT, ONNX Runtime, torch), power mode."""
    l4t = read_l4t()
    gpu, capability = detect_gpu()
    info: dict[str, Any] = {
        "edgefold": __version__, "hostname": platform.node(), "machine": platform.machine(),
        "python": platform.python_version(), "board": board_model(), "module": module_id(), "l4t": l4t,
        "jetpack": jetpack_for(l4t),
        "gpu": gpu, "compute_capability": capability, "cuda": cuda_version(),
        "tensorrt": package_version("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_libs"),
        "onnxruntime": package_version("onnxruntime", "onnxruntime-gpu"),
        "torch": package_version("torch"), "jetson_stats": package_version("jetson-stats"),
    }
    if info["tensorrt"] is None:
        try:  # JetPack installs TensorRT's Python bindings from apt, without package metadata
            import tensorrt

            info["tensorrt"] = tensorrt.__version__
        except ImportError:
            pass
    try:
        import onnxruntime

        info["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError:
        info["onnxruntime_providers"] = []
    info.update(power_mode())
    return info

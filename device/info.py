"""What this device is: board, L4T/JetPack, GPU, runtimes and their versions, power mode.

Versions come from package metadata where possible, so describing the device does not import
torch or TensorRT (seconds of start-up, gigabytes of memory on a small Jetson).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from device import __version__
from device.runners.engine import detect_gpu, read_l4t
from device.power.jetson import board_model, jetpack_for, module_id


def package_version(*names: str) -> str | None:
    """The installed version of the first distribution found among ``names``."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# Where JetPack's apt packages (python3-libnvinfer) put TensorRT's Python bindings: the system Python's
# dist-packages, which a virtual environment sees only when created with --system-site-packages.
JETPACK_PYTHON_DIRS = ("/usr/lib/python3/dist-packages", "/usr/local/lib/python3/dist-packages")


def venv_includes_system_site(prefix: str | None = None) -> bool | None:
    """Whether this Python's virtual environment sees the system's packages; None outside a venv."""
    cfg = Path(prefix or sys.prefix) / "pyvenv.cfg"
    if not cfg.is_file():
        return None
    for line in cfg.read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "include-system-site-packages":
            return value.strip().lower() == "true"
    return False


def tensorrt_status(system_dirs: tuple[str, ...] = JETPACK_PYTHON_DIRS) -> dict[str, Any]:
    """Which TensorRT this agent's Python finds, where, and, when none, why and how to fix it.

    Found by ``importlib.util.find_spec`` (not imported: seconds and hundreds of MB on a small Jetson).

    Returns:
        ``found``, ``version``, ``location``, and ``reason``/``fix`` when not found; ``runtime_auto`` is
        what a job with ``runtime: auto`` gets here (the pipeline chooses the same way).
    """
    try:
        spec = importlib.util.find_spec("tensorrt")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        version = package_version("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt_libs")
        if version is None:
            try:  # JetPack installs TensorRT's Python bindings from apt, without package metadata
                import tensorrt

                version = tensorrt.__version__
            except Exception as err:  # noqa: BLE001 (found but broken: libnvinfer missing, wrong Python)
                return {"found": False, "version": None, "location": spec.origin, "runtime_auto": "onnxruntime",
                        "reason": f"TensorRT at {spec.origin} does not import: {type(err).__name__}: {err}",
                        "fix": "reinstall TensorRT for this Python (JetPack: apt install python3-libnvinfer)"}
        location = str(Path(spec.origin).parent) if spec.origin else None
        return {"found": True, "version": version, "location": location,
                "runtime_auto": "tensorrt" if _major(version) >= 10 else "onnxruntime", "reason": None, "fix": None}
    hidden = [d for d in system_dirs if (Path(d) / "tensorrt").is_dir()]
    if hidden and venv_includes_system_site() is False:
        reason = (f"TensorRT is installed in {hidden[0]} (JetPack), but this virtual environment ({sys.prefix}) "
                  "was created without --system-site-packages, so it cannot import it")
        fix = (f"{sys.executable} -m venv --system-site-packages --upgrade {sys.prefix} (make agent does this "
               "on a Jetson), then restart the agent")
    else:
        reason = f"no module named 'tensorrt' for {sys.executable}"
        fix = ("on a Jetson: sudo apt install nvidia-tensorrt python3-libnvinfer and a venv with "
               "--system-site-packages (make agent); on a GPU server: pip install 'edgefold[trt]' from NVIDIA's index")
    return {"found": False, "version": None, "location": None, "runtime_auto": "onnxruntime", "reason": reason,
            "fix": fix}


def _major(version: str | None) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


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
    """Board, L4T/JetPack, GPU, CUDA, runtimes (TensorRT with where it was found, or why not; ONNX Runtime,
    torch), power mode."""
    l4t = read_l4t()
    gpu, capability = detect_gpu()
    info: dict[str, Any] = {
        "edgefold": __version__, "hostname": platform.node(), "machine": platform.machine(),
        "python": platform.python_version(), "board": board_model(), "module": module_id(), "l4t": l4t,
        "jetpack": jetpack_for(l4t),
        "gpu": gpu, "compute_capability": capability, "cuda": cuda_version(),
        "tensorrt_status": tensorrt_status(),
        "onnxruntime": package_version("onnxruntime", "onnxruntime-gpu"),
        "torch": package_version("torch"), "jetson_stats": package_version("jetson-stats"),
        "torch_tensorrt": torch_tensorrt_version(),
    }
    info["tensorrt"] = info["tensorrt_status"]["version"]
    try:
        import onnxruntime

        info["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError:
        info["onnxruntime_providers"] = []
    info.update(power_mode())
    # What a device checkpoint's module can be rebuilt from here (read without importing any of it).
    from device.models.architectures import architecture_sources

    info["architectures"] = architecture_sources()
    return info


def torch_tensorrt_version() -> str | None:
    """Torch-TensorRT's version: its distribution's (``torch-tensorrt``; jetson-containers' build registers
    ``torch_tensorrt``), else a module already imported in this process (a source build without metadata).
    Never imported here: it imports torch, seconds and gigabytes on a small Jetson."""
    found = package_version("torch-tensorrt", "torch_tensorrt")
    module = sys.modules.get("torch_tensorrt")
    return found or (getattr(module, "__version__", None) if module is not None else None)


def jtop_status(socket: str | None) -> dict[str, Any] | None:
    """jetson-stats on both sides of the jtop socket: the client this agent's jobs import and the service's
    release, and whether the service accepts the client (it refuses another major.minor). ``None`` off a Jetson
    (no socket)."""
    if not socket or not Path(socket).exists():
        return None
    from device.power.jtop_client import probe

    return probe(socket)


def jtop_banner(status: dict[str, Any] | None) -> str | None:
    """The agent's line on jtop: both versions, or what is wrong with the fix."""
    if status is None:
        return None
    if status.get("ok"):
        return f"jtop: service jetson-stats {status.get('service')}, client {status.get('client')}"
    return f"jtop: NOT usable ({status.get('error')}). fix: {status.get('fix')}"


def runtime_banner(info: dict[str, Any]) -> str:
    """The agent's first line: which TensorRT it found (or why none) and what ``runtime: auto`` runs."""
    status = info.get("tensorrt_status") or {}
    where = info.get("board") or info.get("hostname")
    if status.get("found"):
        return (f"edgefold-agent {info.get('edgefold')} on {where}: TensorRT {status['version']} from "
                f"{status['location']}; runtime auto → {status['runtime_auto']}")
    providers = ", ".join(info.get("onnxruntime_providers") or []) or "none"
    return (f"edgefold-agent {info.get('edgefold')} on {where}: TensorRT NOT found ({status.get('reason')}); runtime "
            f"auto → onnxruntime ({providers}). fix: {status.get('fix')}")

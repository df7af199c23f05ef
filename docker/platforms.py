"""The Jetson agent image's platform table and EdgeFold's image tags (stdlib only: the Makefile runs it).

    python3 docker/platforms.py base L4T        # the base image for an L4T release (36.4.3 -> r36.4.0)
    python3 docker/platforms.py build-args L4T  # --build-arg flags for docker buildx
    python3 docker/platforms.py tag KIND [L4T]  # edgefold-agent:0.1.0-l4t36.4 …
    python3 docker/platforms.py python L4T      # the agent's Python version (for the offline bundle)
    python3 docker/platforms.py build-args L4T --torch-tensorrt   # … with Torch-TensorRT and ModelOpt
    python3 docker/platforms.py torch-tensorrt L4T                # the wheels that flag installs, and their source

The L4T table is the agent's own (``device/l4t.json``: one table for the images, the offline bundle
and the agent's L4T → JetPack). An L4T release not in it is an error naming the known ones, never a
silent fallback; a known release without an image (JetPack 7) is refused by name with the reason.

Torch-TensorRT (the agent's ``torch_tensorrt`` runtime) is installed only behind a flag and only for a release
whose wheels are documented (:data:`JETSON_TORCH_TENSORRT`); for any other release the flag is an error saying
that none is known, never a guessed index or version.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = HERE.parent / "device" / "l4t.json"
DC_BASE = "nvcr.io/nvidia/tensorrt:25.01-py3"  # TensorRT 10.8, CUDA 12.8, Ubuntu 24.04, Python 3.12
PIPELINE_BASE = "python:3.11-slim-bookworm"

# Torch-TensorRT wheels for Jetson, per L4T family: ONLY where a wheel is documented. pytorch/TensorRT's JetPack
# guide (docsrc/getting_started/jetpack.rst@v2.9.0, the same at v2.10.0 and main d7f2062) installs
# "torch==2.8.0 torch_tensorrt==2.8.0 … --extra-index-url https://pypi.jetson-ai-lab.io/jp6/cu126", "built
# specifically for JetPack 6.2" (CUDA 12.6, TensorRT 10.3: L4T 36.4's userspace, which 36.5 images reuse);
# its JetPack wheel requires torch>=2.8.0,<2.9.0, tensorrt>=10.3.0,<10.4.0 (JetPack's own python3-libnvinfer,
# seen through the venv's system site packages) and numpy<2.0.0 (setup.py@v2.9.0 get_jetpack_requirements).
# torchvision: the agent rebuilds every built-in architecture from a device checkpoint with it (device/models/architectures.py),
# so the image carries the one paired with the wheel's torch: torchvision's release table (pytorch/vision README)
# pairs torch 2.8 with 0.23. The guide's install line names 0.24.0, torch 2.9's, which would pull another torch.
# ModelOpt: PyPI's nvidia-modelopt 0.47.0 is pure Python (py3-none-any), requires torch>=2.8 and Python>=3.10.
JETSON_TORCH_TENSORRT_SOURCE = ("pytorch/TensorRT docsrc/getting_started/jetpack.rst@v2.9.0 (wheel and index), "
                                "setup.py@v2.9.0 get_jetpack_requirements (its requirements)")
_JP6_CU126 = {"index": "https://pypi.jetson-ai-lab.io/jp6/cu126",
              "packages": ["torch==2.8.0", "torch_tensorrt==2.8.0", "nvidia-modelopt==0.47.0", "torchvision==0.23.0"],
              # torch_tensorrt's own requirements but tensorrt (from JetPack): the bundle resolves them with the
              # agent's so that one consistent set is downloaded (numpy<2 binds the agent's numpy too).
              "requirements": ["packaging>=23", "typing-extensions>=4.7.0", "dllist", "numpy<2.0.0"],
              "torch_tensorrt": "2.8.0", "tensorrt": "10.3", "source": JETSON_TORCH_TENSORRT_SOURCE}
JETSON_TORCH_TENSORRT = {"36.4": _JP6_CU126, "36.5": _JP6_CU126}


class PlatformError(Exception):
    """An L4T release or image kind EdgeFold does not know."""


def version() -> str:
    text = (HERE.parent / "device" / "__init__.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


def table() -> dict:
    """The L4T families (major.minor → what an agent there runs on)."""
    return json.loads(TABLE.read_text())["families"]


def release(l4t: str) -> tuple[str, dict]:
    """(major.minor key, entry) for an L4T release written as 36.4.3, r36.4.0, R36 or 36.4."""
    match = re.fullmatch(r"[rR]?(\d+)(?:\.(\d+))?(?:\.\d+)?", (l4t or "").strip())
    if not match or match.group(2) is None:
        raise PlatformError(f"L4T={l4t!r} is not an L4T release such as 36.4.3 (see: cat /etc/nv_tegra_release; "
                            f"R36 REVISION 4.3 is 36.4.3); known: {', '.join(table())}")
    key = f"{match.group(1)}.{match.group(2)}"
    entries = table()
    if key not in entries:
        raise PlatformError(f"unknown L4T release {l4t} ({key}); known: {', '.join(entries)}. "
                            f"Add it to device/l4t.json with its base image from NGC's l4t-jetpack tags")
    return key, entries[key]


def image_release(l4t: str) -> tuple[str, dict]:
    """Like :func:`release`, for building an image: a release without a verified base image is refused
    with the reason and what to use instead."""
    key, entry = release(l4t)
    if not entry.get("base"):
        raise PlatformError(f"no agent image for L4T {l4t} (JetPack {entry['jetpack']}, CUDA {entry['cuda']}, TensorRT "
                            f"{entry['tensorrt']}): {entry['image_refused']}")
    return key, entry


def torch_tensorrt(l4t: str) -> dict:
    """The documented Torch-TensorRT wheels for an L4T release: index, pinned packages, requirements, source.

    Raises:
        PlatformError: The release is unknown, or no Torch-TensorRT wheel is known for it (named, with why).
    """
    key, entry = release(l4t)
    wheels = JETSON_TORCH_TENSORRT.get(key)
    if wheels is None:
        raise PlatformError(
            f"no Torch-TensorRT wheel is known for L4T {l4t} (JetPack {entry['jetpack']}, CUDA {entry['cuda']}, "
            f"TensorRT {entry['tensorrt']}): the only documented Jetson wheels are torch_tensorrt 2.8.0 for JetPack "
            f"6.2 / CUDA 12.6 / TensorRT 10.3 (L4T {', '.join(sorted(JETSON_TORCH_TENSORRT))}; "
            f"{JETSON_TORCH_TENSORRT_SOURCE}). Build it on the device from source (the same guide), or leave the "
            "flag off: the agent's other runtimes work without it")
    return wheels


def tag(kind: str, l4t: str | None = None, with_torch_tensorrt: bool = False) -> str:
    """Image tags carry EdgeFold's version, and the L4T release for Jetson images; ``-torchtrt<version>`` marks an
    image with Torch-TensorRT."""
    if kind == "jetson":
        key, _ = image_release(l4t)
        extra = f"-torchtrt{torch_tensorrt(l4t)['torch_tensorrt']}" if with_torch_tensorrt else ""
        return f"edgefold-agent:{version()}-l4t{key}{extra}"
    if kind == "dc":
        extra = f"-torchtrt{DC_TORCH_TENSORRT['torch_tensorrt']}" if with_torch_tensorrt else ""
        return f"edgefold-agent:{version()}-dc-trt{DC_BASE.rsplit(':', 1)[1].split('-')[0]}{extra}"
    if kind == "pipeline":
        return f"edgefold-pipeline:{version()}"
    raise PlatformError(f"unknown image kind {kind!r}; known: jetson, dc, pipeline")


def build_args(l4t: str, with_torch_tensorrt: bool = False) -> list[str]:
    """``--build-arg`` flags for the Jetson image; with Torch-TensorRT, its index and pinned packages (comma-separated:
    the Makefile splits the flags on spaces).

    Raises:
        PlatformError: No image for the release, or (with the flag) no known Torch-TensorRT wheel for it.
    """
    _, entry = image_release(l4t)
    args = [f"--build-arg=BASE={entry['base']}", f"--build-arg=PYTHON_VERSION={entry['agent_python']}",
            f"--build-arg=PYTHON_SOURCE={entry['python_source']}"]
    if with_torch_tensorrt:
        wheels = torch_tensorrt(l4t)
        args += ["--build-arg=WITH_TORCH_TENSORRT=1", f"--build-arg=TORCH_TENSORRT_INDEX={wheels['index']}",
                 f"--build-arg=TORCH_TENSORRT_PACKAGES={','.join(wheels['packages'])}"]
    return args


# The data-center image: Torch-TensorRT paired with the torch the image pins (dc.Dockerfile TORCH_VERSION 2.14.1) and
# the TensorRT that release requires. Read at main d7f2062 (version.txt 2.14.0a0; no v2.14.0 tag in the snapshot):
# pyproject.toml (torch>=2.14.0.dev,<2.15.0; [[tool.uv.index]] https://pypi.nvidia.com), setup.py
# get_x86_64_requirements (tensorrt>=11.1.0,<11.2.0, and tensorrt-cu13{,-bindings,-libs} of the same range for a
# CUDA 13 torch, which PyPI's torch 2.14 is), dev_dep_versions.yml (__tensorrt_version__ 11.1.0).
DC_TORCH_TENSORRT = {"torch_tensorrt": "2.14.0", "torch": "2.14.1", "tensorrt": ">=11.1.0,<11.2.0",
                     "tensorrt_packages": ["tensorrt-cu13", "tensorrt-cu13-bindings", "tensorrt-cu13-libs"],
                     "index": "https://pypi.nvidia.com",
                     "source": "pytorch/TensorRT pyproject.toml, setup.py get_x86_64_requirements and "
                               "dev_dep_versions.yml @main d7f2062 (2.14.0a0)"}


def main(argv: list[str]) -> int:
    try:
        command, *rest = argv
        if command == "base":
            print(image_release(rest[0])[1]["base"])
        elif command == "python":
            print(release(rest[0])[1]["agent_python"])
        elif command == "build-args":
            print(" ".join(build_args(rest[0], with_torch_tensorrt="--torch-tensorrt" in rest[1:])))
        elif command == "torch-tensorrt":
            wheels = torch_tensorrt(rest[0])
            print(f"{' '.join(wheels['packages'])} --extra-index-url {wheels['index']}  # {wheels['source']}")
        elif command == "tag":
            flag = "--torch-tensorrt" in rest
            rest = [arg for arg in rest if arg != "--torch-tensorrt"]
            print(tag(rest[0], rest[1] if len(rest) > 1 else None, with_torch_tensorrt=flag))
        elif command == "table":
            for key, entry in table().items():
                print(f"{key:6} JetPack {entry['jetpack']:20} {entry['base'] or 'no image (bundle only)':40} "
                      f"Python {entry['agent_python']} CUDA {entry['cuda']} TensorRT {entry['tensorrt']} "
                      f"in agent: {'yes' if entry['tensorrt_in_agent'] else 'no'}"
                      + (f" ({entry['note']})" if entry.get("note") else ""))
        else:
            raise PlatformError(f"unknown command {command!r}")
    except PlatformError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ValueError, IndexError):
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

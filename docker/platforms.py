"""The Jetson agent image's platform table and EdgeFold's image tags (stdlib only: the Makefile runs it).

    python3 docker/platforms.py base L4T        # the base image for an L4T release (36.4.3 -> r36.4.0)
    python3 docker/platforms.py build-args L4T  # --build-arg flags for docker buildx
    python3 docker/platforms.py tag KIND [L4T]  # edgefold-agent:0.1.0-l4t36.4 …
    python3 docker/platforms.py python L4T      # the agent's Python version (for the offline bundle)

The L4T table is the agent's own (``device/l4t.json``: one table for the images, the offline bundle
and the agent's L4T → JetPack). An L4T release not in it is an error naming the known ones, never a
silent fallback; a known release without an image (JetPack 7) is refused by name with the reason.
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


def tag(kind: str, l4t: str | None = None) -> str:
    """Image tags carry EdgeFold's version, and the L4T release for Jetson images."""
    if kind == "jetson":
        key, _ = image_release(l4t)
        return f"edgefold-agent:{version()}-l4t{key}"
    if kind == "dc":
        return f"edgefold-agent:{version()}-dc-trt{DC_BASE.rsplit(':', 1)[1].split('-')[0]}"
    if kind == "pipeline":
        return f"edgefold-pipeline:{version()}"
    raise PlatformError(f"unknown image kind {kind!r}; known: jetson, dc, pipeline")


def build_args(l4t: str) -> list[str]:
    _, entry = image_release(l4t)
    return [f"--build-arg=BASE={entry['base']}", f"--build-arg=PYTHON_VERSION={entry['agent_python']}",
            f"--build-arg=PYTHON_SOURCE={entry['python_source']}"]


def main(argv: list[str]) -> int:
    try:
        command, *rest = argv
        if command == "base":
            print(image_release(rest[0])[1]["base"])
        elif command == "python":
            print(release(rest[0])[1]["agent_python"])
        elif command == "build-args":
            print(" ".join(build_args(rest[0])))
        elif command == "tag":
            print(tag(rest[0], rest[1] if len(rest) > 1 else None))
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

"""The Jetson agent image's platform table and EdgeFold's image tags (stdlib only: the Makefile runs it).

    python3 docker/platforms.py base L4T        # the base image for an L4T release (36.4.3 -> r36.4.0)
    python3 docker/platforms.py build-args L4T  # --build-arg flags for docker buildx
    python3 docker/platforms.py tag KIND [L4T]  # edgefold-agent:0.1.0-l4t36.4 …
    python3 docker/platforms.py python L4T      # the agent's Python version (for the offline bundle)

An L4T release not in ``l4t.json`` is an error naming the known ones, never a silent fallback.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLE = HERE / "l4t.json"
DC_BASE = "nvcr.io/nvidia/tensorrt:25.01-py3"  # TensorRT 10.8, CUDA 12.8, Ubuntu 24.04, Python 3.12
PIPELINE_BASE = "python:3.11-slim-bookworm"


class PlatformError(Exception):
    """An L4T release or image kind EdgeFold does not know."""


def version() -> str:
    text = (HERE.parent / "device" / "__init__.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


def table() -> dict:
    return {k: v for k, v in json.loads(TABLE.read_text()).items() if not k.startswith("_")}


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
                            f"Add it to docker/l4t.json with its base image from NGC's l4t-jetpack tags")
    return key, entries[key]


def tag(kind: str, l4t: str | None = None) -> str:
    """Image tags carry EdgeFold's version, and the L4T release for Jetson images."""
    if kind == "jetson":
        key, _ = release(l4t)
        return f"edgefold-agent:{version()}-l4t{key}"
    if kind == "dc":
        return f"edgefold-agent:{version()}-dc-trt{DC_BASE.rsplit(':', 1)[1].split('-')[0]}"
    if kind == "pipeline":
        return f"edgefold-pipeline:{version()}"
    raise PlatformError(f"unknown image kind {kind!r}; known: jetson, dc, pipeline")


def build_args(l4t: str) -> list[str]:
    _, entry = release(l4t)
    return [f"--build-arg=BASE={entry['base']}", f"--build-arg=PYTHON_VERSION={entry['agent_python']}",
            f"--build-arg=PYTHON_SOURCE={entry['python_source']}"]


def main(argv: list[str]) -> int:
    try:
        command, *rest = argv
        if command == "base":
            print(release(rest[0])[1]["base"])
        elif command == "python":
            print(release(rest[0])[1]["agent_python"])
        elif command == "build-args":
            print(" ".join(build_args(rest[0])))
        elif command == "tag":
            print(tag(rest[0], rest[1] if len(rest) > 1 else None))
        elif command == "table":
            for key, entry in table().items():
                print(f"{key:6} JetPack {entry['jetpack']:18} {entry['base']:40} Python {entry['agent_python']} "
                      f"TensorRT in agent: {'yes' if entry['tensorrt_in_agent'] else 'no (' + entry['note'] + ')'}")
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

"""The ``edgefold-agent`` command line (device side; imports without torch).

``edgefold-agent device`` prints what this machine would build and measure with. The agent
daemon itself (``serve``) is not built yet and says so.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any, Sequence

from device import __version__
from device.engine import detect_gpu, jetpack_for, read_l4t
from device.errors import EdgeFoldError


def describe_device() -> dict[str, Any]:
    """Board, L4T/JetPack, GPU, and the inference runtimes importable here."""
    l4t = read_l4t()
    gpu, capability = detect_gpu()
    info: dict[str, Any] = {"edgefold": __version__, "machine": platform.machine(), "python": platform.python_version(),
                            "l4t": l4t, "jetpack": jetpack_for(l4t), "gpu": gpu, "compute_capability": capability}
    try:
        import tensorrt

        info["tensorrt"] = tensorrt.__version__
    except ImportError:
        info["tensorrt"] = None
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
        info["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError:
        info["onnxruntime"] = None
    return info


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``edgefold-agent`` console script."""
    parser = argparse.ArgumentParser(prog="edgefold-agent", description="EdgeFold's device agent.")
    parser.add_argument("--version", action="version", version=f"edgefold-agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("device", help="print this device's fingerprint and runtimes as JSON")
    sub.add_parser("serve", help="run the agent daemon (not built yet)")
    args = parser.parse_args(argv)
    try:
        if args.command == "device":
            print(json.dumps(describe_device(), indent=2))
            return 0
        raise EdgeFoldError("the agent daemon is not built yet",
                            fix="benchmark on the device by hand with the trtexec line recorded in the run's "
                                "manifest (stages.quantize.metrics.trtexec)")
    except EdgeFoldError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.fix:
            print(f"  fix: {err.fix}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())

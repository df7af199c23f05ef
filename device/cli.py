"""The ``edgefold-agent`` command line (device side; imports without torch).

``edgefold-agent serve`` runs the agent daemon; ``edgefold-agent device`` prints what this machine
would build and measure with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from device import __version__
from device.errors import EdgeFoldError
from device.info import describe_device

__all__ = ["describe_device", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``edgefold-agent`` console script."""
    parser = argparse.ArgumentParser(prog="edgefold-agent", description="EdgeFold's device agent.")
    parser.add_argument("--version", action="version", version=f"edgefold-agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("device", help="print this device's fingerprint and runtimes as JSON")
    serve = sub.add_parser("serve", help="run the agent daemon (HTTP API v1; schema: GET /openapi.json with the token)",
                           description="Runs the agent: jobs one at a time, each in a child process; state in "
                                       "DATA_DIR/agent.db. Flags override the --config file.")
    serve.add_argument("--config", type=Path, help="YAML file of settings (keys as the flags, with underscores)")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1: loopback only)")
    serve.add_argument("--port", type=int, help="port (default 8765)")
    serve.add_argument("--data-dir", type=Path, help="jobs, results and artifacts (default ~/.local/share/edgefold-agent)")
    serve.add_argument("--token-file", type=Path,
                       help="file holding the bearer token (default: $EDGEFOLD_AGENT_TOKEN, else DATA_DIR/token, "
                            "generated on first start)")
    serve.add_argument("--job-timeout-s", type=float, help="wall-clock limit of one job (default 1800)")
    serve.add_argument("--max-upload-mib", type=int, help="largest artifact accepted (default 1024)")
    serve.add_argument("--jtop-socket", help="the jtop service's socket (default /run/jtop.sock)")
    serve.add_argument("--nvpmodel-conf", help="the board's nvpmodel configuration, which sweeps check each mode "
                                               "against (default /etc/nvpmodel.conf)")
    serve.add_argument("--thermal-dir", help="the kernel's thermal zones, which sustained jobs read trip points from "
                                             "(default /sys/devices/virtual/thermal)")
    serve.add_argument("--thermal-margin-c", type=float, help="a sustained job stops when a zone comes within this "
                                                              "of its critical trip point (default 5)")
    serve.add_argument("--trust-programs", action="store_true", default=None,
                       help="accept torch.export programs (.pt2). Loading one runs Python that torch generates from "
                            "the file: with this on, any holder of the token can run code on this device. Off by "
                            "default: the device rebuilds modules from device checkpoints (.device.pt) instead")
    args = parser.parse_args(argv)
    try:
        if args.command == "device":
            print(json.dumps(describe_device(), indent=2))
            return 0
        from device.service.agent import AgentConfig, serve as run_server

        config = AgentConfig.load(args.config, host=args.host, port=args.port, data_dir=args.data_dir,
                                  token_file=args.token_file, job_timeout_s=args.job_timeout_s,
                                  max_upload_mib=args.max_upload_mib, jtop_socket=args.jtop_socket,
                                  nvpmodel_conf=args.nvpmodel_conf, thermal_dir=args.thermal_dir,
                                  thermal_margin_c=args.thermal_margin_c, trust_programs=args.trust_programs)
        run_server(config)
        return 0
    except EdgeFoldError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.fix:
            print(f"  fix: {err.fix}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())

"""Checks a running agent: health answers, and (with a token) its device description is sane.

    python3 smoke_check.py URL [--token-file F] [--machine aarch64] [--tensorrt] [--timeout-s 90]
    python3 smoke_check.py --health-only URL     # the images' HEALTHCHECK

Standard library only: it runs inside the images and on bare build hosts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request


def get(url: str, token: str | None = None, timeout: float = 4.0) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--token-file")
    parser.add_argument("--health-only", action="store_true")
    parser.add_argument("--machine", help="expected platform.machine() (aarch64, x86_64)")
    parser.add_argument("--tensorrt", action="store_true", help="TensorRT must be importable in the agent")
    parser.add_argument("--timeout-s", type=float, default=90.0, help="how long to wait for health")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    if args.health_only:
        try:
            return 0 if get(f"{url}/v1/health")["status"] == "ok" else 1
        except (OSError, ValueError, KeyError):
            return 1
    deadline = time.monotonic() + args.timeout_s
    while True:
        try:
            health = get(f"{url}/v1/health")
            break
        except (OSError, ValueError) as err:
            if time.monotonic() > deadline:
                print(f"FAIL: no health answer from {url} in {args.timeout_s:g} s: {err}", file=sys.stderr)
                return 1
            time.sleep(1)
    problems = [] if health.get("status") == "ok" and health.get("version") else [f"health says {health}"]
    if args.token_file:
        token = open(args.token_file).read().strip()
        try:
            get(f"{url}/v1/device")
            problems.append("/v1/device answered without a token")
        except urllib.error.HTTPError as err:
            if err.code != 401:
                problems.append(f"/v1/device without a token answered {err.code}, not 401")
        device = get(f"{url}/v1/device", token, timeout=30)
        if args.machine and device.get("machine") != args.machine:
            problems.append(f"machine is {device.get('machine')}, expected {args.machine}")
        if args.tensorrt and not device.get("tensorrt"):
            problems.append("TensorRT is not importable in the agent")
        if not device.get("onnxruntime") or "CPUExecutionProvider" not in device.get("onnxruntime_providers", []):
            problems.append(f"ONNX Runtime missing: {device.get('onnxruntime_providers')}")
        print(json.dumps({k: device.get(k) for k in ("edgefold", "machine", "board", "l4t", "jetpack", "gpu", "cuda",
                                                     "tensorrt", "onnxruntime")}))
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    if not problems:
        print(f"ok: agent {health['version']} at {url}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

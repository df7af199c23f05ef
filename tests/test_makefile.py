"""The README's commands as a user types them (without rebuilding the environment)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(subprocess.run(["which", "make"], capture_output=True).returncode != 0,
                                reason="make is not installed")


def make(repo, *args):
    venv = Path(sys.prefix)
    # -o: treat the environment as up to date, so the test never reinstalls it.
    return subprocess.run(["make", "-s", f"VENV={venv}", "-o", f"{venv}/.edgefold-installed", *args],
                          cwd=repo, capture_output=True, text=True, timeout=120)


def test_unknown_model_lists_the_recipes(repo):
    result = make(repo, "edge", "MODEL=nope")
    assert result.returncode != 0
    assert "no recipe for model 'nope'" in result.stderr
    assert "resnet50" in result.stderr and "tiny" in result.stderr


def test_help_names_the_variables(repo):
    result = make(repo, "help")
    assert result.returncode == 0
    for word in ("make edge MODEL=resnet50", "DATA=", "WEIGHTS=", "EDGE=", "DC=", "DEVICES=", "make agent", "make test"):
        assert word in result.stdout


def test_test_workers_are_one_more_than_the_cores_at_most_eight(repo):
    """make test's pytest-xdist workers: the cores plus one (a worker waiting on an agent leaves its core to another),
    never more than 8; TEST_WORKERS=1 runs without xdist."""
    cores = len(os.sched_getaffinity(0))
    dry = make(repo, "-n", "test")
    assert f"-m pytest -n {min(cores + 1, 8)} --dist loadfile" in dry.stdout, dry.stdout
    one = make(repo, "-n", "test", "TEST_WORKERS=1")
    assert "-m pytest" in one.stdout and " -n " not in one.stdout.split("-m pytest", 1)[1]


def test_makefile_variables_have_defaults(repo):
    text = (repo / "Makefile").read_text()
    for variable in ("PYTHON", "VENV", "MODEL", "DATA", "WEIGHTS", "RUN"):
        assert f"\n{variable.ljust(8)} ?=" in text or f"\n{variable} ?=" in text


def test_image_targets_refuse_unknown_or_missing_l4t(repo):
    unknown = make(repo, "docker-jetson", "L4T=40.1", "DOCKER=false")
    assert unknown.returncode != 0 and "unknown L4T release 40.1" in unknown.stderr and "36.4" in unknown.stderr
    missing = make(repo, "bundle", "L4T=")
    assert missing.returncode != 0 and "L4T is required" in missing.stderr


def _jetson(tmp_path):
    release = tmp_path / "nv_tegra_release"  # what JetPack writes; only its presence matters here
    release.write_text("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n")
    return release


def test_make_agent_on_a_jetson_gives_the_venv_the_systems_packages(repo, tmp_path):
    """JetPack's TensorRT is in the system's dist-packages; the agent's venv must see it, and it installs only the
    agent's packages (no torch). jetson-stats is not pinned there: the system's jtop client is the one that matches
    the system's jtop service, and the venv gets its own only where none is importable."""
    venv = tmp_path / "venv"
    args = ["make", "-n", "agent", f"VENV={venv}", "PYTHON=python3"]
    on_jetson = subprocess.run([*args, f"JETSON_RELEASE={_jetson(tmp_path)}"], cwd=repo, capture_output=True,
                               text=True, timeout=60).stdout
    assert f"-m venv --system-site-packages {venv}" in on_jetson
    assert "--upgrade" in on_jetson and ".[device]" in on_jetson and "build" not in on_jetson
    assert "python -c 'import jtop' 2>/dev/null || " in on_jetson and "pip install --quiet 'jetson-stats'" in on_jetson
    elsewhere = subprocess.run([*args, f"JETSON_RELEASE={tmp_path / 'none'}"], cwd=repo, capture_output=True,
                               text=True, timeout=60).stdout
    assert "--system-site-packages" not in elsewhere and ".[device,nvml]" in elsewhere


def test_an_old_venv_is_switched_over_and_then_imports_the_systems_tensorrt(repo, tmp_path):
    """A venv made before (without --system-site-packages) keeps its packages and gains the system's: checked
    with a STAND-IN ``tensorrt`` package placed in this machine's system site-packages for the test's length
    (no JetPack here), removed afterwards."""
    import sysconfig

    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = Path(subprocess.run([str(base), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    standin = site / "tensorrt"
    if standin.exists() or not os.access(site, os.W_OK):
        pytest.skip(f"cannot place a stand-in tensorrt in {site} (a real one, or not writable)")
    venv = tmp_path / "venv"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    probe = [str(venv / "bin" / "python"), "-c", "import tensorrt; print(tensorrt.__version__, tensorrt.__file__)"]
    standin.mkdir()
    try:
        (standin / "__init__.py").write_text('__version__ = "10.3.0"  # STAND-IN for a test, not TensorRT\n')
        assert subprocess.run(probe, capture_output=True, text=True).returncode != 0  # the old venv cannot see it
        switched = subprocess.run(["make", "-s", "venv-system-site", f"VENV={venv}", f"PYTHON={base}",
                                   f"JETSON_RELEASE={_jetson(tmp_path)}"], cwd=repo, capture_output=True, text=True,
                                  timeout=120)
        assert switched.returncode == 0, switched.stderr
        assert "switching it over" in switched.stdout
        found = subprocess.run(probe, capture_output=True, text=True)
        assert found.returncode == 0 and found.stdout.startswith(f"10.3.0 {standin}"), found.stderr
    finally:
        shutil.rmtree(standin, ignore_errors=True)
    assert not standin.exists() and sysconfig.get_paths()["purelib"] != str(site)  # this venv never saw it


def test_make_ship_runs_edgefold_ship_on_the_models_latest_run(repo, tiny_run, tmp_path):
    """make ship MODEL=tiny RUNG=best: the latest run of the model shipped into TO (the README's command)."""
    runs = tmp_path / "runs"
    shutil.copytree(tiny_run.run_dir, runs / "tiny" / "shared")
    (runs / "tiny" / "latest").symlink_to("shared")
    result = make(repo, "ship", "MODEL=tiny", "RUNG=best", f"RUNS={runs}", f"TO={tmp_path / 'bundle'}")
    assert result.returncode == 0, result.stderr
    assert "shipping " in result.stdout and (tmp_path / "bundle" / "card.md").is_file()
    again = make(repo, "ship", "MODEL=tiny", f"RUNS={runs}", f"TO={tmp_path / 'bundle'}")
    assert again.returncode == 2 and "exists" in again.stderr and "fix: pass another folder" in again.stderr

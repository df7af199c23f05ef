"""The README's commands as a user types them (without rebuilding the environment)."""

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


def test_makefile_variables_have_defaults(repo):
    text = (repo / "Makefile").read_text()
    for variable in ("PYTHON", "VENV", "MODEL", "DATA", "WEIGHTS", "RUN"):
        assert f"\n{variable.ljust(8)} ?=" in text or f"\n{variable} ?=" in text


def test_image_targets_refuse_unknown_or_missing_l4t(repo):
    unknown = make(repo, "docker-jetson", "L4T=40.1", "DOCKER=false")
    assert unknown.returncode != 0 and "unknown L4T release 40.1" in unknown.stderr and "36.4" in unknown.stderr
    missing = make(repo, "bundle", "L4T=")
    assert missing.returncode != 0 and "L4T is required" in missing.stderr

"""The CLI as a user meets it: exit codes, fix-it messages, no tracebacks for mistakes."""

import json
import subprocess
import sys

import pytest


def edgefold(repo, *args, env_extra=None):
    import os

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=repo, capture_output=True, text=True,
                          env=env, timeout=300)


def test_unknown_model_lists_recipes_without_traceback(repo):
    result = edgefold(repo, "run", "nope")
    assert result.returncode == 2
    assert "error: no recipe for model 'nope'" in result.stderr
    assert "resnet50" in result.stderr and "tiny" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_set_and_bad_stage(repo, tmp_path):
    result = edgefold(repo, "run", "tiny", "--set", "prune.macs_targt=0.3", "--runs-dir", str(tmp_path))
    assert result.returncode == 2 and "prune.macs_targt: unknown key" in result.stderr
    result = edgefold(repo, "run", "tiny", "--until", "deplyo", "--runs-dir", str(tmp_path))
    assert result.returncode == 2 and "unknown stage 'deplyo'" in result.stderr and "deploy" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_fashion_mnist_is_explained(repo, tmp_path):
    result = edgefold(repo, "run", "tiny", "--data", "fashion-mnist", "--runs-dir", str(tmp_path),
                      env_extra={"EDGEFOLD_FASHION_MNIST_DIR": str(tmp_path / "none")})
    assert result.returncode == 2
    assert "Fashion-MNIST not found" in result.stderr and "apt-get install dataset-fashion-mnist" in result.stderr


def test_recipes_and_recipe_commands(repo):
    result = edgefold(repo, "recipes", "--check")
    assert result.returncode == 0 and "resnet50" in result.stdout and "FAIL" not in result.stdout
    result = edgefold(repo, "recipe", "resnet50", "--get", "data.source")
    assert result.stdout.strip() == "fashion-mnist"
    result = edgefold(repo, "recipe", "tiny", "--get", "prune")
    assert json.loads(result.stdout)["macs_target"] == 0.5


@pytest.mark.slow
def test_run_and_runs_listing(repo, tmp_path):
    result = edgefold(repo, "run", "tiny", "--runs-dir", str(tmp_path), "--until", "teacher")
    assert result.returncode == 0, result.stderr
    assert "manifest:" in result.stdout
    listing = edgefold(repo, "runs", "--runs-dir", str(tmp_path), "--json")
    rows = json.loads(listing.stdout)
    assert rows[0]["model"] == "tiny" and rows[0]["stages"] == ["data", "teacher"]
    assert 0.5 < rows[0]["teacher_top1"] <= 1.0


def test_help_tells_the_stages(repo):
    result = edgefold(repo, "run", "--help")
    assert result.returncode == 0 and "--until STAGE" in result.stdout and "prune" in result.stdout

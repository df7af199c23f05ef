"""The CLI as a user meets it: exit codes, fix-it messages, no tracebacks for mistakes.

Two tests start ``python -m pipeline`` as a user does (a mistake, and a real run); the rest call the same
``main`` in this process, which is what the console script runs, without paying for a Python and torch start each.
"""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from pipeline.cli import main


def edgefold(repo, *args, env_extra=None):
    import os

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=repo, capture_output=True, text=True,
                          env=env, timeout=300)


def edgefold_here(capsys, *args):
    """``edgefold ARGS`` in this process: its exit code and what it printed."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


@pytest.mark.slow  # a Python and torch start
def test_unknown_model_lists_recipes_without_traceback(repo):
    result = edgefold(repo, "run", "nope")
    assert result.returncode == 2
    assert "error: no recipe for model 'nope'" in result.stderr
    assert "resnet50" in result.stderr and "tiny" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_set_and_bad_stage(capsys, tmp_path):
    result = edgefold_here(capsys, "run", "tiny", "--set", "prune.macs_targt=0.3", "--runs-dir", str(tmp_path))
    assert result.returncode == 2 and "prune.macs_targt: unknown key" in result.stderr
    result = edgefold_here(capsys, "run", "tiny", "--until", "deplyo", "--runs-dir", str(tmp_path))
    assert result.returncode == 2 and "unknown stage 'deplyo'" in result.stderr and "deploy" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_fashion_mnist_is_explained(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEFOLD_FASHION_MNIST_DIR", str(tmp_path / "none"))
    result = edgefold_here(capsys, "run", "tiny", "--data", "fashion-mnist", "--runs-dir", str(tmp_path))
    assert result.returncode == 2
    assert "Fashion-MNIST not found" in result.stderr and "apt-get install dataset-fashion-mnist" in result.stderr


def test_recipes_and_recipe_commands(capsys):
    result = edgefold_here(capsys, "recipes", "--check")
    assert result.returncode == 0 and "resnet50" in result.stdout and "FAIL" not in result.stdout
    result = edgefold_here(capsys, "recipe", "resnet50", "--get", "data.source")
    assert result.stdout.strip() == "fashion-mnist"
    result = edgefold_here(capsys, "recipe", "tiny", "--get", "prune")
    assert json.loads(result.stdout)["macs_target"] == 0.5


@pytest.mark.slow
def test_run_and_runs_listing(repo, tmp_path, capsys):
    # Two epochs: the listing needs a trained teacher, not the recipe's best one.
    result = edgefold(repo, "run", "tiny", "--runs-dir", str(tmp_path), "--until", "teacher",
                      "--set", "teacher.train.epochs=2")
    assert result.returncode == 0, result.stderr
    assert "manifest:" in result.stdout
    listing = edgefold_here(capsys, "runs", "--runs-dir", str(tmp_path), "--json")
    rows = json.loads(listing.stdout)
    assert rows[0]["model"] == "tiny" and rows[0]["stages"] == ["data", "teacher"]
    assert rows[0]["score"] == "top-1" and 0.5 < rows[0]["teacher_score"] <= 1.0


def test_help_tells_the_stages(capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "--until STAGE" in out and "prune" in out


def test_a_sweep_of_a_detection_run_is_refused_up_front(tmp_path, capsys):
    """Power sweeps are built for classification runs (the task says which commands deploy it again): a detection run
    is refused before any work, named as such, not with a recipe key error from deep inside the run."""
    run = tmp_path / "tiny-det" / "r1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"schema": "edgefold.manifest/1", "model": "tiny-det",
                                                   "task": "detection", "stages": {"quantize": {}}}))
    assert main(["sweep", str(run), "--modes", "all"]) == 2
    err = capsys.readouterr().err
    assert "is a detection run: edgefold sweep is not built for detection runs yet (it is for classification)" in err
    assert "fix: measure this run" in err


def test_a_fix_is_printed_as_the_user_can_type_it(monkeypatch):
    """make's SET='a=1 b=[2, 3]' under make; edgefold run's one --set per key elsewhere."""
    from pipeline.cli import as_typed

    fix = "fix it: SET='preprocess.mean=[0.3, 0.3, 0.3] start.input_range=0-255', then run again"
    monkeypatch.delenv("MAKELEVEL", raising=False)
    assert as_typed(fix) == ("fix it: --set 'preprocess.mean=[0.3, 0.3, 0.3]' --set 'start.input_range=0-255', "
                             "then run again")
    monkeypatch.setenv("MAKELEVEL", "1")
    assert as_typed(fix) == fix

"""Detection trains on the shared engine: a killed teacher resumes from its last epoch and ends as the uninterrupted
one; under torchrun two gloo processes train it and distill the student together (DDP)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.runner import run_pipeline
from tests.pipeline.test_integrity import interrupt_after_first_epoch

# Small enough to train in seconds; the recipe's other settings as shipped.
OVERRIDES = {"teacher.train.epochs": 2, "data.train_images": 256, "data.test_images": 64}


def _weights(run) -> dict:
    return torch.load(run.run_dir / "teacher" / "model.pt", weights_only=True)["state_dict"]


def test_a_killed_detection_teacher_resumes_from_its_last_epoch(tmp_path, monkeypatch, capsys):
    whole = run_pipeline("tiny-det", runs_dir=tmp_path / "a", until="teacher", overrides=OVERRIDES)
    with monkeypatch.context() as patch:
        interrupt_after_first_epoch(patch)
        with pytest.raises(KeyboardInterrupt):
            run_pipeline("tiny-det", runs_dir=tmp_path / "b", until="teacher", overrides=OVERRIDES)
    assert list((tmp_path / "b").glob("tiny-det/*/resume/teacher-*.pt")), "the first epoch's state was kept"
    resumed = run_pipeline("tiny-det", runs_dir=tmp_path / "b", until="teacher", overrides=OVERRIDES)
    assert "teacher: resuming after epoch 1" in capsys.readouterr().err
    a, b = _weights(whole), _weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a), "resumed ≠ uninterrupted"
    history = resumed.manifest.data["stages"]["teacher"]["metrics"]["history"]
    assert [epoch["epoch"] for epoch in history] == [1, 2], "every epoch once, none lost or repeated"
    assert not list(resumed.run_dir.glob("resume/teacher-*.pt")), "a finished stage leaves no resume state"


@pytest.mark.slow  # torchrun: two processes train
def test_two_gloo_processes_train_the_detection_teacher_and_distill_the_student_like_one(repo, tmp_path):
    """The teacher and the student both train under DDP on both ranks (the distillation terms run the student
    module DDP wraps, their adapters averaged as DDP averages the student), with the same global batches as one
    process: the losses close, each epoch recorded once, one log."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "EDGEFOLD_PROGRESS": "0", "EDGEFOLD_DEVICE": "cpu",
           "OMP_NUM_THREADS": "1"}
    overrides = {**OVERRIDES, "distill.train.epochs": 1}
    single = run_pipeline("tiny-det", runs_dir=tmp_path / "one", until="distill", overrides=overrides)
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    process = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                              "-m", "pipeline", "run", "tiny-det", "--runs-dir", str(tmp_path / "two"),
                              "--until", "distill", *sets], cwd=repo, env=env, capture_output=True, text=True,
                             timeout=600)
    out = process.stdout + process.stderr
    assert process.returncode == 0, out[-3000:]
    stages = json.loads(next(Path(tmp_path / "two").glob("tiny-det/*/manifest.json")).read_text())["stages"]
    assert stages["teacher"]["env"]["processes"] == 2 and out.count("[ teacher] running") == 1, "one log: rank 0's"
    assert out.count("[ distill] running") == 1
    for stage, epochs in (("teacher", 2), ("distill", 1)):
        one = single.manifest.data["stages"][stage]["metrics"]["history"]
        two = stages[stage]["metrics"]["history"]
        assert [epoch["processes"] for epoch in two] == [2] * epochs, stage
        # The same global batches; each rank normalizes its losses by its own positive anchors (and matched anchors
        # for the class KD), so the losses are close, not equal.
        for a, b in zip(one, two):
            assert b["loss"] == pytest.approx(a["loss"], rel=0.1), (stage, a["loss"], b["loss"])
    assert stages["teacher"]["metrics"]["map"] > 0 and stages["distill"]["metrics"]["map"] > 0

"""Segmentation trains on the shared engine, as every task: a killed teacher resumes from its last epoch and ends as
the uninterrupted one; under torchrun two gloo processes train the teacher and distil the student together (DDP:
the pixel-wise KD loss runs inside the student's own forward)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.runner import run_pipeline
from tests.pipeline.test_integrity import interrupt_after_first_epoch

# Small enough to train in seconds; enough for the teacher to find some shape (its sanity gate).
OVERRIDES = {"teacher.train.epochs": 3, "data.test_images": 32, "distill.train.epochs": 1}


def _weights(run) -> dict:
    return torch.load(run.run_dir / "teacher" / "model.pt", weights_only=True)["state_dict"]


@pytest.mark.slow  # trains a teacher three times
def test_a_killed_segmentation_teacher_resumes_from_its_last_epoch(tmp_path, monkeypatch, capsys):
    whole = run_pipeline("tiny-seg", runs_dir=tmp_path / "a", until="teacher", overrides=OVERRIDES)
    with monkeypatch.context() as patch:
        interrupt_after_first_epoch(patch)
        with pytest.raises(KeyboardInterrupt):
            run_pipeline("tiny-seg", runs_dir=tmp_path / "b", until="teacher", overrides=OVERRIDES)
    assert list((tmp_path / "b").glob("tiny-seg/*/resume/teacher-*.pt")), "the first epoch's state was kept"
    resumed = run_pipeline("tiny-seg", runs_dir=tmp_path / "b", until="teacher", overrides=OVERRIDES)
    assert "teacher: resuming after epoch 1" in capsys.readouterr().err
    a, b = _weights(whole), _weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a), "resumed ≠ uninterrupted"
    history = resumed.manifest.data["stages"]["teacher"]["metrics"]["history"]
    assert [epoch["epoch"] for epoch in history] == [1, 2, 3], "every epoch once, none lost or repeated"


@pytest.mark.slow  # torchrun: two processes train
def test_two_gloo_processes_train_and_distil_the_segmenter_like_one(repo, tmp_path):
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "EDGEFOLD_PROGRESS": "0", "EDGEFOLD_DEVICE": "cpu",
           "OMP_NUM_THREADS": "1"}
    single = run_pipeline("tiny-seg", runs_dir=tmp_path / "one", until="distill", overrides=OVERRIDES)
    sets = [arg for key, value in OVERRIDES.items() for arg in ("--set", f"{key}={value}")]
    process = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                              "-m", "pipeline", "run", "tiny-seg", "--runs-dir", str(tmp_path / "two"),
                              "--until", "distill", *sets], cwd=repo, env=env, capture_output=True, text=True,
                             timeout=600)
    out = process.stdout + process.stderr
    assert process.returncode == 0, out[-3000:]
    two = json.loads(next(Path(tmp_path / "two").glob("tiny-seg/*/manifest.json")).read_text())["stages"]
    one = single.manifest.data["stages"]
    assert out.count("[ teacher] running") == 1, "one log: rank 0's"
    for stage in ("teacher", "distill"):
        assert two[stage]["env"]["processes"] == 2, stage
        assert [epoch["processes"] for epoch in two[stage]["metrics"]["history"]] == \
            [2] * len(one[stage]["metrics"]["history"]), f"{stage} on both ranks"
        # The same global batches, normalized over them (synchronized BatchNorm): only float summation order
        # differs between one process and two.
        for a, b in zip(one[stage]["metrics"]["history"], two[stage]["metrics"]["history"]):
            assert b["loss"] == pytest.approx(a["loss"], rel=0.02), (stage, a["loss"], b["loss"])
        assert two[stage]["metrics"]["miou"] == pytest.approx(one[stage]["metrics"]["miou"], abs=0.02), stage

"""The manifest contract: stages recorded, cached stages skipped, --force and --until honoured."""

import json
import shutil

import pytest
import torch

from device.errors import ConfigError, ManifestError
from pipeline.checkpoint import load_checkpoint
from device.files import sha256_file
from pipeline.core.manifest import Manifest
from pipeline.runner import list_runs, run_pipeline
from pipeline.core.stage import STAGE_ORDER
from pipeline.tasks.classification.train import evaluate



@pytest.fixture
def run_copy(tiny_run, tmp_path):
    """A private copy of the shared tiny run, so tests may change it."""
    target = tmp_path / "runs" / "tiny" / "shared"
    shutil.copytree(tiny_run.run_dir, target)
    return target


def test_manifest_records_every_stage(tiny_run):
    data = json.loads((tiny_run.run_dir / "manifest.json").read_text())
    assert data["schema"] == "edgefold.manifest/1" and data["model"] == "tiny"
    assert len(data["recipe"]["sha256"]) == 64
    assert list(data["stages"]) == list(STAGE_ORDER)
    for name, entry in data["stages"].items():
        assert set(entry) >= {"config_sha256", "inputs", "outputs", "sha256", "metrics", "env", "seconds"}
        for rel, digest in entry["sha256"].items():
            assert sha256_file(tiny_run.run_dir / rel) == digest
        assert entry["env"]["torch"] == torch.__version__
    prune = data["stages"]["prune"]
    assert prune["inputs"] == {"data.splits": "data/splits.npz", "data.dataset": "data/dataset.json",
                               "teacher.model": "teacher/model.pt", "teacher.predictions": "teacher/predictions.npy"}


def test_tiny_pipeline_results(tiny_run):
    from pipeline.tasks.classification.images import image_batches

    stages = tiny_run.manifest.data["stages"]
    rungs = stages["evaluate"]["metrics"]["rungs"]
    assert rungs["teacher"]["top1"] >= 0.9, "the tiny teacher learns digits"
    assert rungs["student"]["top1"] >= rungs["teacher"]["top1"] - 0.05, "distillation recovers the pruned model"
    assert rungs["student"]["macs_fraction"] == pytest.approx(0.5, abs=0.05)
    assert rungs["student"]["params_m"] < rungs["teacher"]["params_m"]
    history = stages["distill"]["metrics"]["history"]
    assert history[-1]["loss"] < history[0]["loss"]
    student, info = load_checkpoint(tiny_run.run_dir / "distill" / "model.pt")
    assert info["arch"] == "tiny_resnet" and student(torch.zeros(1, 3, 16, 16)).shape == (1, 10)
    # The ladder's numbers belong to the saved checkpoints: scoring them afresh gives the same.
    for rung, folder in (("student", "distill"), ("pruned", "prune")):
        model, _ = load_checkpoint(tiny_run.run_dir / folder / "model.pt")
        fresh = evaluate(model, image_batches(tiny_run, "test", 256), torch.device("cpu"))
        assert fresh["top1"] == pytest.approx(rungs[rung]["top1"]) and fresh["top5"] == pytest.approx(rungs[rung]["top5"])
        assert rungs[rung]["params_m"] == pytest.approx(sum(p.numel() for p in model.parameters()) / 1e6)


def test_second_run_skips_every_stage_and_reuses_every_measurement(run_copy, capsys):
    before = json.loads((run_copy / "manifest.json").read_text())["stages"]
    ctx = run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared")
    after = ctx.manifest.data["stages"]
    # deploy always re-checks the devices' fingerprints; its unchanged results leave the report cached.
    assert {k: v["finished"] for k, v in after.items() if k != "deploy"} == \
        {k: v["finished"] for k, v in before.items() if k != "deploy"}
    assert after["deploy"]["sha256"] == before["deploy"]["sha256"]
    assert after["deploy"]["metrics"]["jobs"] == 5 and after["deploy"]["metrics"]["jobs_reused"] == 5 * 2, \
        "5 rungs × 2 rounds, every window reused"
    assert capsys.readouterr().err.count("cached") == len(STAGE_ORDER) - 1


def test_force_redoes_one_stage(run_copy, capsys):
    before = json.loads((run_copy / "manifest.json").read_text())["stages"]
    marker = run_copy / "evaluate" / "left-by-the-last-run"
    marker.write_text("")
    ctx = run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", force=["evaluate"], until="evaluate")
    after = ctx.manifest.data["stages"]
    assert not marker.exists(), "a forced stage starts from an empty folder"
    assert after["evaluate"]["metrics"] == before["evaluate"]["metrics"]
    for name in ("data", "teacher", "prune", "distill", "export", "quantize"):
        assert after[name] == before[name]
    assert list(after) == list(STAGE_ORDER), "a re-run stage keeps its place in the manifest"
    assert "[evaluate] running" in capsys.readouterr().err


def test_changed_config_reruns_that_stage_and_what_depends_on_it(run_copy, capsys):
    before = json.loads((run_copy / "manifest.json").read_text())["stages"]
    # (One epoch leaves a student whose INT8 drop is large; the gate is tested elsewhere.)
    # Through evaluate: deploy and report would re-time every rung on the loopback agent and assert nothing here.
    overrides = {"distill.train.epochs": 1, "quantize.accuracy_budget_points": 100.0}
    ctx = run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", overrides=overrides, until="evaluate")
    after = ctx.manifest.data["stages"]
    err = capsys.readouterr().err
    assert "[ distill] running" in err and "[evaluate] running" in err
    assert after["teacher"] == before["teacher"] and after["prune"] == before["prune"]
    assert len(after["distill"]["metrics"]["history"]) == 1
    assert list(after) == list(STAGE_ORDER)
    assert ctx.manifest.data["overrides"] == overrides


def test_tampered_output_is_rebuilt(run_copy, capsys):
    (run_copy / "evaluate" / "ladder.json").write_text("{}")
    run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", until="evaluate")
    assert "[evaluate] running" in capsys.readouterr().err
    assert json.loads((run_copy / "evaluate" / "ladder.json").read_text())["rungs"]


def test_until_stops_early(tmp_path):
    ctx = run_pipeline("tiny", runs_dir=tmp_path, until="data")
    assert list(ctx.manifest.data["stages"]) == ["data"]
    assert (tmp_path / "tiny" / "latest").resolve() == ctx.run_dir.resolve()
    # A later run without --run-id resumes the latest run.
    again = run_pipeline("tiny", runs_dir=tmp_path, until="data")
    assert again.run_dir == ctx.run_dir
    fresh = run_pipeline("tiny", runs_dir=tmp_path, until="data", new=True)
    assert fresh.run_dir != ctx.run_dir
    assert [row["stages"] for row in list_runs(tmp_path, "tiny")] == [["data"], ["data"]]


def test_unknown_stage_names_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="(?s)unknown stage 'distil'.*distill"):
        run_pipeline("tiny", runs_dir=tmp_path, until="distil")
    with pytest.raises(ConfigError, match="unknown stage"):
        run_pipeline("tiny", runs_dir=tmp_path, force=["quantise"])


def test_corrupt_manifest_is_reported(tmp_path):
    run_dir = tmp_path / "tiny" / "broken"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="is corrupt") as err:
        run_pipeline("tiny", runs_dir=tmp_path, run_id="broken")
    assert "delete" in err.value.fix


def test_run_dir_of_another_model_is_refused(tmp_path):
    run_dir = tmp_path / "tiny" / "other"
    Manifest(run_dir, {"schema": "edgefold.manifest/1", "model": "resnet50", "stages": {}}).save()
    with pytest.raises(ManifestError, match="belongs to model 'resnet50'"):
        run_pipeline("tiny", runs_dir=tmp_path, run_id="other")


def test_teacher_from_a_torchvision_state_dict(tiny_run, tmp_path):
    """WEIGHTS=path: a plain state_dict with a 1000-class head; the head is replaced, the rest kept."""
    teacher, _ = load_checkpoint(tiny_run.run_dir / "teacher" / "model.pt")
    state = teacher.state_dict()
    state["fc.weight"], state["fc.bias"] = torch.zeros(1000, 64), torch.zeros(1000)
    weights = tmp_path / "teacher.pth"
    torch.save(state, weights)
    ctx = run_pipeline("tiny", runs_dir=tmp_path / "runs", until="teacher",
                       overrides={"teacher.weights": str(weights), "teacher.train.epochs": 1})
    entry = ctx.manifest.stage("teacher")
    assert entry["config"]["weights_sha256"] == sha256_file(weights)
    loaded, info = load_checkpoint(ctx.run_dir / "teacher" / "model.pt")
    assert info["meta"]["replaced_head"] is True
    # One epoch from the shared features trains the fresh head far past chance.
    assert entry["metrics"]["top1"] > 0.5


def test_imagenet_weights_without_internet_say_what_to_do(tmp_path, monkeypatch):
    """torchvision's download is replaced by one that fails as it does offline (no internet here)."""
    import urllib.error

    import torchvision

    def offline(name, weights=None, **kwargs):
        if weights:
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
        return real(name, weights=weights, **kwargs)

    real = torchvision.models.get_model
    monkeypatch.setattr(torchvision.models, "get_model", offline)
    from device.errors import CheckpointError

    with pytest.raises(CheckpointError, match="could not download torchvision's ImageNet weights") as err:
        run_pipeline("tiny", runs_dir=tmp_path, until="teacher",
                     overrides={"teacher.weights": "imagenet", "teacher.arch": "resnet18"})
    assert "WEIGHTS=/path/to/state_dict.pth" in err.value.fix


def test_a_failed_rerun_keeps_the_previous_outputs(run_copy, monkeypatch):
    from device.errors import StageError
    from pipeline.stages.prune import PruneStage

    before = json.loads((run_copy / "manifest.json").read_text())["stages"]["prune"]
    checkpoint = run_copy / before["outputs"]["model"]

    def interrupted(self, ctx, workdir):
        (workdir / "model.pt").write_bytes(b"half-written")
        raise StageError("interrupted on purpose")

    monkeypatch.setattr(PruneStage, "run", interrupted)
    with pytest.raises(StageError):
        run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", force=["prune"], until="prune")
    after = json.loads((run_copy / "manifest.json").read_text())["stages"]["prune"]
    assert after == before, "the manifest still describes the previous prune"
    assert sha256_file(checkpoint) == before["sha256"][before["outputs"]["model"]]


@pytest.mark.slow
def test_grey_input_runs_end_to_end(tmp_path):
    """preprocess.channels: 1 builds a one-channel stem, exports and quantizes one-channel ONNX, and the loopback
    agent's jobs (fed by the device's preprocessing) time and score it."""
    import onnx

    overrides = {"preprocess.channels": 1, "preprocess.mean": [0.3], "preprocess.std": [0.38],
                 "teacher.train.epochs": 3, "distill.train.epochs": 2, "deploy.rounds": 1}
    ctx = run_pipeline("tiny", runs_dir=tmp_path, overrides=overrides)
    student, info = load_checkpoint(ctx.run_dir / "distill" / "model.pt")
    assert student(torch.zeros(1, 1, 16, 16)).shape == (1, 10)
    for path in (ctx.run_dir / "export" / "student.onnx", ctx.run_dir / "quantize" / "student.int8.onnx"):
        dims = onnx.load(path).graph.input[0].type.tensor_type.shape.dim
        assert [d.dim_value for d in dims[1:]] == [1, 16, 16], path
    rungs = ctx.manifest.data["stages"]["evaluate"]["metrics"]["rungs"]
    assert rungs["teacher"]["top1"] >= 0.8
    rows = json.loads((ctx.run_dir / "report" / "results.json").read_text())["rows"]
    measured = {row["rung"]: row for row in rows if row["status"] == "measured"}
    assert {"teacher", "student", "student_int8"} <= set(measured)
    assert all(row["latency_p50_ms"] > 0 for row in measured.values())
    assert measured["student_int8"]["device_top1"] == pytest.approx(rungs["student_int8"]["top1"], abs=0.05)


@pytest.mark.parametrize("weights, message", [("text", "is not a torch file"),
                                              ("other", "does not match tiny_resnet")])
def test_weights_that_do_not_fit_are_refused_before_anything_is_written(tmp_path, weights, message):
    """WEIGHTS is loaded into the architecture before the first stage, before the run directory exists: a wrong
    file leaves no run behind (and no 'latest' pointing at an empty one)."""
    from device.errors import CheckpointError

    path = tmp_path / "weights.pth"
    if weights == "text":
        path.write_text("not weights\n")
    else:
        torch.save({"conv.weight": torch.zeros(4, 3, 3, 3)}, path)
    with pytest.raises(CheckpointError, match=message):
        run_pipeline("tiny", runs_dir=tmp_path / "runs", overrides={"teacher.weights": str(path)})
    assert not (tmp_path / "runs").exists()

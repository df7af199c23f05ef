"""The model stages written once (:mod:`pipeline.stages.teacher`, :mod:`pipeline.stages.prune`,
:mod:`pipeline.stages.distill`) over a task's hooks (:mod:`pipeline.train.hooks`): driven here by a toy task made of
hooks alone (a linear model), so what the stages do themselves is seen apart from classification's and detection's
hooks, which the pipelines' tests run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipeline.core import codehash
from pipeline.runner import stage_code_roots
from pipeline.stages.distill import DistillStage
from pipeline.stages.prune import PruneStage
from pipeline.stages.teacher import TeacherStage
from pipeline.train.hooks import DistillHooks, ModelHooks, PruneHooks, Scored, Start


class ToyModels(DistillHooks, PruneHooks):
    """A task of two features and one score; it records what the stages asked of it, in order."""

    unkeyed = {"teacher": ("check",)}

    def __init__(self, from_pruned: bool = True):
        self.calls: list[str] = []
        self.pruned = from_pruned

    def keys(self, ctx, stage):
        return {"toy_input": 2}

    def from_pruned(self, ctx):
        return self.pruned

    def teacher(self, ctx):
        self.calls.append("teacher")
        # Drawn after the stage seeds: the same recipe seed gives the same start.
        return Start(torch.nn.Linear(2, 2), {"arch": "toy", "num_classes": 2}, replaced=["bias"], notes={"probe": "ok"})

    def student(self, ctx):
        self.calls.append("student")
        return Start(torch.nn.Linear(2, 2), {"arch": "toy-student"})

    def checkpoint(self, ctx, stage):
        self.calls.append(f"load {stage}")
        return Start(torch.nn.Linear(2, 2), {"arch": "toy"})

    def prune(self, ctx, start, workdir):
        self.calls.append("prune")
        start.model = torch.nn.Linear(2, 1)  # one output channel of two
        start.saved["plan"] = {"kept": [0]}
        return {"macs_fraction": 0.5}

    def assess(self, ctx, start, workdir):
        self.calls.append("assess")
        return Scored({"score": 0.25, "sanity": "at chance"})

    def train(self, ctx, start, cfg, stage, teacher=None):
        self.calls.append(f"train {stage}" + (" with teacher" if teacher is not None else ""))
        return [{"epoch": 1, "loss": 0.5}]

    def finish(self, ctx, start, cfg, stage, workdir, teacher=None):
        self.calls.append(f"finish {stage}")
        (workdir / "predictions.npy").write_bytes(b"")
        return Scored({"score": 0.75}, {"predictions": workdir / "predictions.npy"})

    def save(self, path, start):
        self.calls.append("save")
        torch.save(start.model.state_dict(), path)
        return path

    def size(self, ctx, start):
        return {"params_m": sum(p.numel() for p in start.model.parameters()) / 1e6, "macs_g": 0.0}

    def summary(self, stage, metrics):
        return f"{stage} score {metrics['score']}"


def _ctx(epochs: int = 1, weights: str | None = None, check: str = "error") -> SimpleNamespace:
    train = SimpleNamespace(epochs=epochs, seed=3)
    sections = {"teacher": {"arch": "toy", "weights": weights, "check": check}, "distill": {"temperature": 4.0}}
    recipe = SimpleNamespace(teacher=SimpleNamespace(train=train, weights=weights),
                             distill=SimpleNamespace(train=train), section=lambda name: dict(sections[name]))
    logged: list[str] = []
    return SimpleNamespace(recipe=recipe, log=logged.append, logged=logged, resume=None)


def test_the_teacher_stage_seeds_builds_trains_scores_then_saves(tmp_path):
    hooks, ctx = ToyModels(), _ctx()
    result = TeacherStage(hooks).run(ctx, tmp_path)
    assert hooks.calls == ["teacher", "train teacher", "finish teacher", "save"]
    assert result.outputs == {"model": tmp_path / "model.pt", "predictions": tmp_path / "predictions.npy"}
    assert result.metrics == {"score": 0.75, "params_m": 6e-6, "macs_g": 0.0, "history": [{"epoch": 1, "loss": 0.5}],
                              "probe": "ok", "weights": None, "replaced_head": ["bias"]}
    assert ctx.logged == ["teacher: head re-initialised for 2 classes (bias)"]
    # Seeded by the stage before the task builds: a second run starts from the same weights.
    (tmp_path / "again").mkdir()
    TeacherStage(ToyModels()).run(_ctx(), tmp_path / "again")
    first, second = torch.load(tmp_path / "model.pt"), torch.load(tmp_path / "again" / "model.pt")
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_no_epochs_scores_the_weights_as_loaded(tmp_path):
    hooks = ToyModels()
    result = TeacherStage(hooks).run(_ctx(epochs=0), tmp_path)
    assert "train teacher" not in hooks.calls and result.metrics["history"] == []


def test_the_teachers_key_is_its_section_less_checks_and_its_weights_bytes(tmp_path):
    stage = TeacherStage(ToyModels())
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"one")
    key = stage.config(_ctx(weights=str(weights)))
    assert key["toy_input"] == 2 and "check" not in key["teacher"]
    assert stage.config(_ctx(weights=str(weights), check="warn")) == key, "a check is not an input"
    weights.write_bytes(b"two")
    assert stage.config(_ctx(weights=str(weights)))["weights_sha256"] != key["weights_sha256"]
    assert stage.config(_ctx(weights="imagenet"))["weights_sha256"] is None


def test_the_distill_stage_trains_the_student_with_the_teacher(tmp_path):
    hooks = ToyModels()
    stage = DistillStage(hooks)
    result = stage.run(_ctx(), tmp_path)
    assert hooks.calls == ["load teacher", "student", "train distill with teacher", "finish distill", "save"]
    assert result.metrics["score"] == 0.75 and result.metrics["history"] and stage.summary(result.metrics) == \
        "distill score 0.75"
    assert stage.needs(_ctx()) == ("data", "teacher", "prune")
    assert DistillStage(ToyModels(from_pruned=False)).needs(_ctx()) == ("data", "teacher")


def test_the_prune_stage_prunes_the_teachers_checkpoint_scores_without_a_gate_and_saves(tmp_path):
    hooks = ToyModels()
    stage = PruneStage(hooks)
    result = stage.run(_ctx(), tmp_path)
    assert hooks.calls == ["load teacher", "prune", "assess", "save"]
    # The size is the pruned model's, the scores recorded as they are.
    assert result.metrics == {"score": 0.25, "sanity": "at chance", "params_m": 3e-6, "macs_g": 0.0,
                              "macs_fraction": 0.5}
    assert torch.load(tmp_path / "model.pt")["weight"].shape == (1, 2)
    assert stage.needs(_ctx()) == ("data", "teacher") and stage.absent(_ctx()) is None


@pytest.mark.parametrize("task", ["classification", "detection"])
def test_each_task_declares_the_shared_stages_with_its_hooks_and_their_code(task):
    """A task's hooks are each stage's code; the distillation loss is the distill stage's alone, so editing it
    leaves a trained teacher cached."""
    import importlib

    stages = importlib.import_module(f"pipeline.tasks.{task}").TASK.stages
    teacher, prune, distill = stages.get("teacher"), stages.get("prune"), stages.get("distill")
    assert type(teacher) is TeacherStage and isinstance(teacher.hooks, ModelHooks)
    assert type(prune) is PruneStage and isinstance(prune.hooks, PruneHooks)
    assert type(distill) is DistillStage and isinstance(distill.hooks, DistillHooks)
    assert teacher.code_modules == (f"pipeline.tasks.{task}.training",)
    assert prune.code_modules == (f"pipeline.tasks.{task}.pruned",)
    assert distill.code_modules == (f"pipeline.tasks.{task}.distilling",)
    loss = {"classification": "pipeline.tasks.classification.losses",
            "detection": "pipeline.tasks.detection.distill"}[task]
    assert loss in codehash.closure(stage_code_roots(distill))
    assert loss not in set(codehash.closure(stage_code_roots(teacher))) | set(codehash.closure(stage_code_roots(prune)))
    assert distill.distributed and teacher.distributed, "every task trains both under torchrun"

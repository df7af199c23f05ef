"""The data stage written once (:mod:`pipeline.stages.data`) over a task's hooks (:mod:`pipeline.core.data.hooks`):
driven by a toy task of hooks alone; classification's and detection's hooks run in the pipelines' tests."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from device.errors import DataError
from pipeline.core.data.hooks import DataHooks, Splits
from pipeline.stages.data import DataStage


class ToyData(DataHooks):
    """Six items of three classes, split in half by seed; a source named ``broken`` is refused."""

    def keys(self, ctx):
        return {"fingerprint": "toy-1"}

    def split(self, ctx, workdir):
        if ctx.recipe.data.source == "broken":
            raise DataError("broken: item 3 has no label", fix="label item 3")
        order = np.random.default_rng(ctx.recipe.data.seed).permutation(6)
        np.savez(workdir / "splits.npz", train=order[:3], test=order[3:])
        return Splits("toy", ["a", "b", "c"], {"splits": workdir / "splits.npz"}, {"train": 3, "test": 3},
                      {"fingerprint": "toy-1"})

    def summary(self, metrics):
        return f"{metrics['source']}: {metrics['num_classes']} classes"


def _ctx(source: str = "toy", seed: int = 0) -> SimpleNamespace:
    data = {"source": source, "seed": seed}
    return SimpleNamespace(recipe=SimpleNamespace(data=SimpleNamespace(**data), section=lambda name: dict(data)))


def test_the_stage_records_the_source_and_its_classes_for_every_later_stage(tmp_path):
    stage = DataStage(ToyData())
    result = stage.run(_ctx(), tmp_path)
    assert result.outputs == {"splits": tmp_path / "splits.npz", "dataset": tmp_path / "dataset.json"}
    assert json.loads((tmp_path / "dataset.json").read_text()) == {"source": "toy", "classes": ["a", "b", "c"],
                                                                  "fingerprint": "toy-1"}
    assert result.metrics == {"source": "toy", "num_classes": 3, "train": 3, "test": 3}
    assert stage.summary(result.metrics) == "toy: 3 classes"
    assert stage.code_modules == (__name__,)


def test_the_key_is_the_data_section_and_the_tasks_keys():
    stage = DataStage(ToyData())
    assert stage.config(_ctx()) == {"data": {"source": "toy", "seed": 0}, "fingerprint": "toy-1"}
    assert stage.config(_ctx(seed=1)) != stage.config(_ctx())


def test_a_broken_source_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(DataError, match="item 3"):
        DataStage(ToyData()).run(_ctx("broken"), tmp_path)
    assert list(tmp_path.iterdir()) == []

"""data stage: deterministic train / calibration / test splits of the recipe's source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.stages.base import STAGES, Stage, StageResult


class DataStage(Stage):
    name = "data"

    def config(self, ctx):
        # The source's fingerprint makes a changed data set invalidate the splits.
        return {"data": ctx.recipe.section("data"), "preprocess": ctx.preprocess.to_dict(),
                "fingerprint": ctx.dataset().fingerprint}

    def run(self, ctx, workdir: Path) -> StageResult:
        cfg, dataset = ctx.recipe.data, ctx.dataset()
        rng = np.random.default_rng(cfg.seed)
        order = rng.permutation(len(dataset.train))
        train_size = min(cfg.train_size or len(order), len(order))
        train = np.sort(order[:train_size])
        rest = order[train_size:]
        # Calibration images come from outside the training subset when there are enough,
        # so INT8 calibration does not only see images the model memorised.
        if len(rest) >= cfg.calib_size:
            calib = np.sort(rest[: cfg.calib_size])
        else:
            calib = np.sort(rng.choice(len(dataset.train), size=min(cfg.calib_size, len(dataset.train)), replace=False))
        test = np.arange(len(dataset.test))
        if cfg.test_size and cfg.test_size < len(test):
            test = np.sort(rng.choice(len(test), size=cfg.test_size, replace=False))
        np.savez(workdir / "splits.npz", train=train, calib=calib, test=test)
        info = {"source": dataset.name, "classes": dataset.classes, "fingerprint": dataset.fingerprint,
                "preprocess": ctx.preprocess.to_dict()}
        (workdir / "dataset.json").write_text(json.dumps(info, indent=2) + "\n")
        counts = np.bincount(dataset.train.labels[train], minlength=dataset.num_classes)
        return StageResult(
            outputs={"splits": workdir / "splits.npz", "dataset": workdir / "dataset.json"},
            metrics={"source": dataset.name, "num_classes": dataset.num_classes, "train": int(len(train)),
                     "calib": int(len(calib)), "test": int(len(test)),
                     "train_per_class_min": int(counts.min()), "train_per_class_max": int(counts.max())},
        )

    def summary(self, metrics):
        return (f"{metrics['source']}: {metrics['num_classes']} classes, {metrics['train']} train / "
                f"{metrics['calib']} calib / {metrics['test']} test")


STAGES.add("data", DataStage())

"""Classification's data as its stages read it, per run: the data set the recipe names, the splits the data stage
recorded, batches of preprocessed images with their labels, and the recipe's preprocessing. Loaded once per run and
kept in the run's context (``ctx.memo``), which knows nothing of classes or images."""

from __future__ import annotations

import numpy as np

from device.errors import DataError
from device.preprocess import Preprocess
from pipeline.core.data.sources import DataSet, load_source
from pipeline.core.recipe import AugmentConfig


def preprocess_of(ctx) -> Preprocess:
    """The recipe's preprocessing (``preprocess``), the one definition the build side and the device share."""
    if "preprocess" not in ctx.memo:
        ctx.memo["preprocess"] = ctx.recipe.preprocess.to_preprocess()
    return ctx.memo["preprocess"]


def data_set(ctx) -> DataSet:
    """The data set ``data.source`` names, loaded once per run."""
    if "dataset" not in ctx.memo:
        ctx.memo["dataset"] = load_source(ctx.recipe.data.source)
    return ctx.memo["dataset"]


def recorded_splits(ctx) -> dict[str, np.ndarray]:
    """Index arrays recorded by the data stage (``train``, ``calib``, ``test``).

    Raises:
        DataError: An index beyond the data set (the data changed under the run).
    """
    path = ctx.manifest.output("data", "splits")
    with np.load(path, allow_pickle=False) as archive:
        splits = {key: archive[key] for key in archive.files}
    dataset = data_set(ctx)
    for key, split in (("train", dataset.train), ("calib", dataset.train), ("test", dataset.test)):
        if len(splits[key]) and splits[key].max() >= len(split):
            raise DataError(f"recorded {key} split indexes beyond the data set ({len(split)} images)",
                            fix="the data changed under this run; rerun with --force data")
    return splits


def image_batches(ctx, split: str, batch_size: int, shuffle: bool = False, augment: AugmentConfig | None = None,
                  seed: int = 0, drop_last: bool = False):
    """Batches over one recorded split (``train``, ``calib`` or ``test``): :class:`batches.Batches`, sharing one
    cache of resized images per run."""
    from pipeline.tasks.classification.batches import Batches

    dataset = data_set(ctx)
    source = dataset.test if split == "test" else dataset.train
    return Batches(source, recorded_splits(ctx)[split], preprocess_of(ctx), batch_size, shuffle=shuffle,
                   augment=augment, seed=seed, workers=ctx.recipe.data.workers, drop_last=drop_last,
                   cache=ctx.memo.setdefault("geometry_cache", {}))

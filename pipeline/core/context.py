"""What a stage sees of its run: the recipe, the manifest, the data and the device."""

from __future__ import annotations


import numpy as np

from device.errors import DataError
from pipeline.core.data.sources import DataSet, load_source
from pipeline.core.manifest import Manifest
from pipeline.core.recipe import AugmentConfig, RecipeBase


class RunContext:
    """One run: recipe, run directory, manifest, lazily loaded data and the torch device.

    Args:
        recipe: The validated recipe (command-line overrides already applied).
        manifest: The run's manifest; None for the preflight checks, which run before anything is written.
        devices: The agents the deploy stage benchmarks on (:class:`pipeline.devices.Device`).
    """

    def __init__(self, recipe: RecipeBase, manifest: Manifest | None, devices=()):
        self.recipe = recipe
        self.devices = list(devices)
        self.resume = None  # the running stage's per-epoch training state (set by the runner)
        self.manifest = manifest
        self.run_dir = manifest.run_dir if manifest is not None else None
        self._dataset: DataSet | None = None
        self._geometry_cache: dict = {}
        self._device = None
        # A detection recipe has no classification preprocessing: its detectors resize and normalise themselves.
        self.preprocess = recipe.preprocess.to_preprocess() if hasattr(recipe, "preprocess") else None

    @classmethod
    def of_run(cls, manifest: Manifest) -> "RunContext":
        """The context of a finished run, from its manifest: its recipe as it ran (the overrides applied again).

        Raises:
            ConfigError: The run's recipe file is gone.
        """
        from pathlib import Path

        from device.errors import ConfigError
        from pipeline.core.recipe import load_recipe

        recipe_path = (manifest.data.get("recipe") or {}).get("path")
        if not recipe_path or not Path(recipe_path).is_file():
            raise ConfigError(f"the run's recipe {recipe_path} is gone", fix="restore the recipe the run was made with")
        recipe, _, _ = load_recipe(recipe_path, manifest.data.get("overrides") or {})
        return cls(recipe, manifest)

    @staticmethod
    def log(message: str) -> None:
        """The run's log (rank 0 only): :func:`pipeline.core.log.log`."""
        from pipeline.core.log import log

        log(message)

    @property
    def device(self):
        if self._device is None:
            from pipeline.core.compute import pick_device

            self._device = pick_device()
        return self._device

    def dataset(self) -> DataSet:
        if self._dataset is None:
            self._dataset = load_source(self.recipe.data.source)
        return self._dataset

    def splits(self) -> dict[str, np.ndarray]:
        """Index arrays recorded by the data stage (``train``, ``calib``, ``test``)."""
        path = self.manifest.output("data", "splits")
        with np.load(path, allow_pickle=False) as archive:
            splits = {key: archive[key] for key in archive.files}
        dataset = self.dataset()
        for key, split in (("train", dataset.train), ("calib", dataset.train), ("test", dataset.test)):
            if len(splits[key]) and splits[key].max() >= len(split):
                raise DataError(f"recorded {key} split indexes beyond the data set ({len(split)} images)",
                                fix="the data changed under this run; rerun with --force data")
        return splits

    def batches(self, split: str, batch_size: int, shuffle: bool = False, augment: AugmentConfig | None = None,
                seed: int = 0, drop_last: bool = False):
        """Batches over one recorded split (``train``, ``calib`` or ``test``)."""
        from pipeline.core.data.batches import Batches

        dataset = self.dataset()
        source = dataset.test if split == "test" else dataset.train
        return Batches(source, self.splits()[split], self.preprocess, batch_size, shuffle=shuffle, augment=augment,
                       seed=seed, workers=self.recipe.data.workers, drop_last=drop_last, cache=self._geometry_cache)

"""What a stage sees of its run: the recipe, the manifest, the devices and the torch device; a task keeps its own
data in ``memo``."""

from __future__ import annotations

from pipeline.core.manifest import Manifest
from pipeline.core.recipe import RecipeBase


class RunContext:
    """One run: recipe, run directory, manifest, the torch device, and what its task keeps (``memo``).

    Args:
        recipe: The validated recipe (command-line overrides already applied).
        manifest: The run's manifest; None for the preflight checks, which run before anything is written.
        devices: The agents the deploy stage benchmarks on (:class:`pipeline.deploy.devices.Device`).
    """

    def __init__(self, recipe: RecipeBase, manifest: Manifest | None, devices=()):
        self.recipe = recipe
        self.devices = list(devices)
        self.resume = None  # the running stage's per-epoch training state (set by the runner)
        self.manifest = manifest
        self.run_dir = manifest.run_dir if manifest is not None else None
        self._device = None
        # What a task keeps for the run while its stages run (classification: its data set, splits' images, the
        # resized-image cache): the context itself knows no task's data.
        self.memo: dict = {}

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

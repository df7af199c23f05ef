"""Channel importance, built in one place for every pruner (the MACs target's ratio, the knapsack's per-group scores,
the detector's backbone): Torch-Pruning's group estimators by the recipe's ``prune.importance`` name."""

from __future__ import annotations

from typing import Any

from device.errors import ConfigError, require

# The recipe's names: weight magnitude (L1 or L2, divided by the group's mean, Torch-Pruning's default normalizer, so
# every group's channels sum to its width) and first-order Taylor (|Σ w·∂L/∂w| per channel summed over the group's
# layers, not normalized: squared and averaged over batches by pipeline.prune.channels.taylor_scores). ``auto`` is
# the magnitude the MACs target has always used.
NAMES = ("l1", "l2", "taylor", "auto")


def torch_pruning():
    """Torch-Pruning, imported lazily with the install line when it is missing."""
    import warnings

    # A layer's own per-channel parameter (timm's layer-scale gamma, shape (C,) or (C,1,1)) is narrowed along its
    # last non-singleton dimension, its channels: right for every such parameter seen, and warned at every graph.
    warnings.filterwarnings("ignore", message="Unwrapped parameters detected", category=UserWarning)
    return require("torch_pruning", "Torch-Pruning", "pip install torch-pruning==1.6.1")


def estimator(importance: str) -> Any:
    """Torch-Pruning's group estimator for ``importance`` (one of :data:`NAMES`).

    Raises:
        ConfigError: A name that is no estimator (a recipe validates it first; this guards a caller's typo).
    """
    tp = torch_pruning()
    if importance == "taylor":
        return tp.importance.GroupTaylorImportance(group_reduction="sum", normalizer=None, multivariable=True)
    if importance in ("l1", "l2", "auto"):
        return tp.importance.GroupMagnitudeImportance(p=1 if importance == "l1" else 2)
    raise ConfigError(f"prune.importance {importance!r} is not an importance estimator",
                      fix=f"choose one of {', '.join(NAMES)}")

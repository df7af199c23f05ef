"""Channel pruning of a detector to a MACs target, with the head's anchor-sized layers kept whole.

Follows Torch-Pruning's own torchvision example (``examples/torchvision_models/torchvision_pruning.py``): RetinaNet's
``cls_logits``/``bbox_reg``, FCOS's ``cls_logits``/``bbox_reg``/``bbox_ctrness`` and SSD's whole head go in
``ignored_layers``; the backbone and the FPN are pruned (and with them the input side of the shared head convs,
which DepGraph couples to the FPN's outputs). The channel ratio is bisected on copies until the MACs, counted at
the detector's own input size, reach the target. A library: the detection prune stage will call it.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from device.errors import StageError
from pipeline.tasks.detection.models import DETECTORS, kept_whole
from pipeline.models import count_macs
from pipeline.prune.importance import estimator, torch_pruning
from pipeline.prune.ratio import bisect_target


@dataclass
class DetectionPruneResult:
    """What a detection prune did (recorded in the manifest).

    Attributes:
        ratio: The uniform channel ratio applied to the prunable layers.
        base_macs: MACs per image before, at ``input_size``.
        macs: MACs per image after.
        fraction: ``macs / base_macs``.
        input_size: Square input side the MACs were counted at.
        kept_whole: ``[{module, reason, shape}]``: what pruning left whole, and why.
    """

    ratio: float
    base_macs: int
    macs: int
    fraction: float
    input_size: int
    kept_whole: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _head_shapes(model: torch.nn.Module, modules: list[str]) -> dict[str, dict[str, tuple[int, ...]]]:
    """Every parameter shape under each kept module (for SSD's head: all of it, input widths included)."""
    return {name: {p: tuple(t.shape) for p, t in model.get_submodule(name).named_parameters()} for name in modules}


def _pruner(model: torch.nn.Module, arch: str, ratio: float, input_shape, round_to: int, importance: str):
    tp = torch_pruning()
    ignored = [model.get_submodule(kept.module) for kept in kept_whole(arch, model)]
    return tp.pruner.MetaPruner(
        model, torch.zeros(input_shape),
        importance=estimator(importance),
        pruning_ratio=ratio, iterative_steps=1, ignored_layers=ignored, round_to=round_to)


def prune_with_ratio(model: torch.nn.Module, arch: str, ratio: float, input_size: int, round_to: int = 8,
                     importance: str = "l2") -> torch.nn.Module:
    """Prunes ``model`` in place at a uniform channel ``ratio``, the head's kept layers untouched; returns it."""
    model.eval()  # traced in eval mode: the detector's training forward needs targets
    if ratio > 0:
        _pruner(model, arch, ratio, (1, 3, input_size, input_size), round_to, importance).step()
    return model


def prune_detector(model: torch.nn.Module, arch: str, macs_target: float, input_size: int | None = None,
                   round_to: int = 8, importance: str = "l2", tolerance: float = 0.05,
                   iterations: int = 10) -> DetectionPruneResult:
    """Prunes ``model`` (an ``arch`` detector, in place) towards ``macs_target`` of its MACs.

    Args:
        model: The detector; pruned in place.
        arch: Its registry key (which layers are kept whole).
        macs_target: Pruned MACs as a fraction of the unpruned detector's.
        input_size: Square side the MACs are counted at; default the architecture's.
        round_to: Channel counts rounded to this multiple.
        importance: ``l1`` or ``l2`` weight magnitude.
        tolerance: Relative tolerance on the target; the bisection stops inside it.
        iterations: Most trial prunes of the bisection.

    Raises:
        StageError: The target cannot be approached (the kept head alone costs more), or a kept layer's shape
            changed (a Torch-Pruning dependency the ignore list missed: never a silently different head).
    """
    size = input_size or DETECTORS.get(arch).input_size
    shape = (1, 3, size, size)
    model.eval()
    base = count_macs(model, shape)
    kept = kept_whole(arch, model)
    shapes_before = _head_shapes(model, [k.module for k in kept])

    def fraction(ratio: float) -> float:
        return count_macs(prune_with_ratio(copy.deepcopy(model), arch, ratio, size, round_to, importance), shape) / base

    tried = bisect_target(fraction, 0.0, 0.95, macs_target, tolerance * macs_target, iterations=iterations)
    ratio, achieved = min(tried, key=lambda kv: abs(kv[1] - macs_target))
    if achieved > macs_target * (1 + tolerance) and ratio >= 0.9:
        raise StageError(f"{arch}: pruning the backbone and neck reaches {achieved:.1%} of the MACs at best, above the "
                         f"target {macs_target:.1%}: the head kept whole costs too much",
                         fix=f"raise prune.macs_target to about {achieved:.2f}, or choose a smaller detector")
    prune_with_ratio(model, arch, ratio, size, round_to, importance)
    shapes_after = _head_shapes(model, [k.module for k in kept])
    changed = [name for name in shapes_before if shapes_before[name] != shapes_after[name]]
    if changed:
        raise StageError(f"{arch}: pruning changed layers that must stay whole: {', '.join(changed)}",
                         fix="report this: Torch-Pruning reached them through a dependency the ignore list missed")
    macs = count_macs(model, shape)
    return DetectionPruneResult(
        ratio=float(ratio), base_macs=int(base), macs=int(macs), fraction=macs / base, input_size=size,
        kept_whole=[{"module": k.module, "reason": k.reason,
                     "shapes": {p: list(s) for p, s in shapes_after[k.module].items()}} for k in kept])

"""Channel groups, their widths and their importance: the pruning mechanics both targets share.

A *channel group* is one of Torch-Pruning's dependency groups (a convolution's output channels with
everything coupled to them: its BatchNorm, the next layers' inputs, every other layer on the same residual
stream), named by its root layer. A *plan* is a width per group. This module finds the groups and their
candidate widths, scores channels (magnitude or Taylor), and prunes a model to a plan keeping each group's
most important channels. It measures nothing and imports nothing of the device side: the MACs target's
knapsack (``importance: taylor``) and the latency budget both plan in these terms.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from device.errors import ConfigError, StageError
from pipeline.prune.importance import estimator as importance_estimator


@dataclass(frozen=True)
class ChannelGroup:
    """One prunable dependency group, named by its root layer (the layer whose outputs it prunes)."""

    name: str
    full: int
    candidates: tuple[int, ...]  # widths the plan may choose, ascending, the full width last
    block: int = 1  # channels per group of a grouped convolution in this group: it loses whole blocks


def _tp():
    from pipeline.prune.importance import torch_pruning

    return torch_pruning()


def _graph(model: nn.Module, input_shape):
    return _tp().DependencyGraph().build_dependency(model, example_inputs=torch.zeros(input_shape))


def _groups(model: nn.Module, arch: str, graph) -> Iterator[tuple[str, Any, Any]]:
    """(root name, root module, group) of every prunable group; the classifier's outputs and the layers
    :func:`pipeline.prune.ratio.kept_whole` names are never one."""
    from pipeline.prune.ratio import ignored_modules

    names = {module: name for name, module in model.named_modules()}
    for group in graph.get_all_groups(ignored_layers=ignored_modules(model, arch, graph=graph),
                                      root_module_types=[nn.Conv2d, nn.Linear]):
        root = group[0].dep.target.module
        yield names[root], root, group


def _block_width(group, grouped: set[nn.Module]) -> int:
    """Channels per conv-group of the grouped convolutions inside a dependency group (1: none there)."""
    width = 1
    for item in group:
        module = item.dep.target.module
        if module in grouped:
            width = math.lcm(width, module.out_channels // module.groups)
    return width


def prunable_groups(model: nn.Module, arch: str, input_shape, round_to: int) -> list[ChannelGroup]:
    """The channel groups of ``model`` with their candidate widths (multiples of ``round_to`` and the full width).

    A group that holds a grouped convolution (RegNet's, ResNeXt's) loses whole conv-groups, as on the MACs
    path (:func:`pipeline.prune.ratio.grouped_convs`): its widths are multiples of both ``round_to`` and
    the conv-group width.
    """
    from pipeline.prune.ratio import grouped_convs

    grouped = set(grouped_convs(model))
    groups = []
    for name, root, group in _groups(model, arch, _graph(model, input_shape)):
        full = root.out_channels if isinstance(root, nn.Conv2d) else root.out_features
        if isinstance(root, nn.Conv2d) and root.groups > 1:
            continue  # a depthwise or grouped layer is pruned with the group that feeds it
        block = _block_width(group, grouped)
        step = math.lcm(block, round_to)
        candidates = sorted({w for w in range(step, full, step)} | {full})
        groups.append(ChannelGroup(name, full, tuple(candidates), block))
    return groups


def widths_of(model: nn.Module, groups: list[ChannelGroup]) -> dict[str, int]:
    """The current width of every group (its root layer's output channels)."""
    modules = dict(model.named_modules())
    return {g.name: (modules[g.name].out_channels if isinstance(modules[g.name], nn.Conv2d)
                     else modules[g.name].out_features) for g in groups}


def taylor_scores(model: nn.Module, arch: str, input_shape, batches, count: int = 32,
                  groups: list[tuple[str, Any]] | None = None) -> dict[str, torch.Tensor]:
    """Each group's per-channel Taylor importance, in channel order: the first-order loss change of removing
    the channel, squared per batch and averaged over ``count`` training batches (Molchanov et al., CVPR 2019,
    the importance HALP's knapsack weighs against milliseconds).

    Why per batch and squared: at a trained model the *mean* gradient is near zero, so |w·Σ∂L/∂w| over
    accumulated batches mostly measures which gradients happened not to cancel; the squared per-batch change
    is the expected loss increase's curvature term and is additive over channels, as the knapsack needs.
    A loss change is comparable across groups, so it is not normalized per group.

    Args:
        groups: (name, group) pairs of a DepGraph of ``model`` already built (else one is built here).

    Raises:
        ConfigError: When ``batches`` yields nothing.
    """
    estimator = importance_estimator("taylor")
    if groups is None:
        groups = [(name, group) for name, _, group in _groups(model, arch, _graph(model, input_shape))]
    was_training = model.training
    model.eval()  # eval-mode BatchNorm: the statistics the pruned model is evaluated with
    totals: dict[str, torch.Tensor] = {}
    seen = 0
    try:
        for batch in batches:
            if seen >= count:
                break
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
            for name, group in groups:
                score = estimator(group).detach().double() ** 2
                totals[name] = totals[name] + score if name in totals else score
            seen += 1
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    if not seen:
        raise ConfigError("prune.importance taylor got no training batches", fix="check the data stage's train split")
    return {name: total / seen for name, total in totals.items()}


def channel_scores(model: nn.Module, arch: str, input_shape, importance: str,
                   batches=None) -> dict[str, torch.Tensor]:
    """Each group's per-channel importance in channel order; in a group with a grouped convolution every
    channel holds its conv-group's mean (whole conv-groups are kept or cut).

    ``l1``/``l2``: Torch-Pruning's group magnitude, divided by the group's mean (its default ``normalizer``),
    as its own global pruning compares groups. ``taylor``: :func:`taylor_scores` over ``batches``.

    Raises:
        ConfigError: For ``taylor`` without training batches.
    """
    from pipeline.prune.ratio import grouped_convs

    if importance == "taylor" and batches is None:
        raise ConfigError("prune.importance taylor needs training batches", fix="use l2, or run it in the prune stage")
    groups = [(name, group) for name, _, group in _groups(model, arch, _graph(model, input_shape))]
    if importance == "taylor":
        scores = taylor_scores(model, arch, input_shape, batches, groups=groups)
    else:
        estimator = importance_estimator(importance)
        scores = {name: estimator(group).detach() for name, group in groups}
    grouped = set(grouped_convs(model))
    for name, group in groups:
        block = _block_width(group, grouped) if grouped else 1
        if block > 1:
            means = scores[name].reshape(-1, block).mean(1, keepdim=True)
            scores[name] = means.expand(-1, block).reshape(-1).clone()
    return scores


def set_widths(model: nn.Module, arch: str, input_shape, widths: dict[str, int], importance: str | None = None,
               scores: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """Prunes ``model`` in place so that each named group keeps ``widths[name]`` channels.

    Args:
        importance: ``"l1"``/``"l2"``: keep each group's most important channels by
            :func:`channel_scores`, computed on the model as given; None: keep the first channels (latency
            models, whose weights do not matter), unless ``scores`` are given.
        scores: Per-channel importances by group, in channel order (``channel_scores``).

    Raises:
        StageError: When a width is not whole conv-groups of a grouped convolution, or Torch-Pruning refuses.
    """
    from pipeline.prune.ratio import grouped_convs, whole_group_graph

    if scores is None and importance:
        scores = channel_scores(model, arch, input_shape, importance)
    convs = grouped_convs(model)
    grouped = set(convs)
    plain = _graph(model, input_shape)
    roots = [(name, root, _block_width(group, grouped)) for name, root, group in _groups(model, arch, plain)]
    # With grouped convolutions, pruned on a graph in which they lose whole conv-groups; each group is taken
    # from its root explicitly (in that graph a grouped convolution can root the group its feeding layer
    # roots here). Without, the plain graph serves (a table builds a hundred sub-networks through here).
    pruning_graph = whole_group_graph(model, convs, input_shape) if convs else contextlib.nullcontext((plain, None))
    with pruning_graph as (graph, _):
        for name, root, block in roots:
            current = root.out_channels if isinstance(root, nn.Conv2d) else root.out_features
            keep = widths.get(name, current)
            if keep >= current:
                continue
            if keep % block:
                raise StageError(f"group {name} holds a grouped convolution of {block}-channel groups; "
                                 f"{keep} channels are not whole groups", fix="use the group's candidate widths")
            if scores is not None:
                order = torch.argsort(scores[name].reshape(-1, block).mean(1)).tolist()  # least important first
            else:
                order = list(range(current // block - 1, -1, -1))
            drop = sorted(b * block + j for b in order[: (current - keep) // block] for j in range(block))
            pruning = graph.get_pruning_group(root, graph.get_pruner_of_module(root).prune_out_channels, drop)
            if not graph.check_pruning_group(pruning):
                raise StageError(f"Torch-Pruning refused to prune group {name} to {keep} channels",
                                 fix="raise prune.round_to or use prune.macs_target")
            pruning.prune()
    return model


def group_importance(model: nn.Module, arch: str, input_shape, importance: str,
                     batches=None) -> dict[str, np.ndarray]:
    """Each group's channel importances (:func:`channel_scores`), most important first: the knapsack's values."""
    return {name: np.sort(value.cpu().numpy().astype(float))[::-1]
            for name, value in channel_scores(model, arch, input_shape, importance, batches).items()}


def at_widths(model: nn.Module, arch: str, input_shape, widths: dict[str, int]) -> nn.Module:
    """A pruned copy of ``model`` at ``widths`` (first channels kept: for timing, not for accuracy)."""
    return set_widths(copy.deepcopy(model).eval(), arch, input_shape, widths)



def step_widths(groups: list[ChannelGroup], final: dict[str, int], step: int, steps: int, round_to: int) -> dict[str, int]:
    """The widths after ``step`` of ``steps`` iterative steps: the way to the plan cut evenly, on ``round_to``."""
    out = {}
    for group in groups:
        goal = group.full - (group.full - final[group.name]) * step / steps
        out[group.name] = final[group.name] if step == steps else min(
            (c for c in group.candidates if c >= final[group.name]), key=lambda c: abs(c - goal))
    return out



class WidthPruner:
    """Prunes to per-group widths in ``cfg.steps`` even steps, each group keeping its most important channels
    (importance recomputed on the fine-tuned model at every step): the pruner of every knapsack plan, the
    latency budget's and the MACs target's with Taylor importance.

    Args:
        batches: A callable returning training batches (needed for ``importance: taylor``).
    """

    def __init__(self, model, arch: str, cfg, groups: list[ChannelGroup], widths: dict[str, int], input_shape,
                 batches=None):
        self.model, self.arch, self.cfg, self.groups, self.widths = model, arch, cfg, groups, widths
        self.input_shape, self.batches = input_shape, batches
        self.done = 0

    def step(self) -> None:
        self.done += 1
        goal = step_widths(self.groups, self.widths, self.done, self.cfg.steps, self.cfg.round_to)
        scores = taylor_scores(self.model, self.arch, self.input_shape, self.batches()) \
            if self.cfg.importance == "taylor" else None
        set_widths(self.model, self.arch, self.input_shape, goal, importance=self.cfg.importance, scores=scores)

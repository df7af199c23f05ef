"""Channel pruning with Torch-Pruning: the MACs path's plan (a uniform ratio, the first layers harder), whole-group
pruning of grouped convolutions, and the plan search. A library: the prune stage and the latency search use it.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from device.errors import StageError
from pipeline.models import ARCHITECTURES, count_macs
from pipeline.core.recipe import PruneConfig
from pipeline.prune.importance import estimator, torch_pruning


class _GroupedConv2d(torch.nn.Conv2d):
    """Marks a grouped convolution while it is pruned by whole groups (swapped back afterwards)."""


def grouped_convs(model: torch.nn.Module) -> list[torch.nn.Conv2d]:
    """Grouped (not depthwise) convolutions with as many inputs as outputs: RegNet's and ResNeXt's.

    Torch-Pruning would prune inside every group, keeping the group count; with groups as narrow as
    ``round_to`` that rounds to all or nothing, and it keeps them whole. They are pruned by whole
    groups instead (:class:`PlanPruner`), the rounding applied to the group count.
    """
    return [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and 1 < m.groups < m.out_channels
            and m.in_channels == m.out_channels]


def _whole_group_pruner(tp):
    base = tp.pruner.function.ConvPruner

    class WholeGroupConvPruner(base):
        """Removes whole groups: rows of the removed groups' filters; each kept filter still sees its
        group's full input width, so the weight's second dimension is untouched. Inputs and outputs
        are the same channels (one function for both: Torch-Pruning couples them, as for depthwise)."""

        def prune_out_channels(self, layer, idxs):
            width = layer.out_channels // layer.groups
            keep = sorted(set(range(layer.out_channels)) - set(int(i) for i in idxs))
            layer.weight = self._prune_parameter_and_grad(layer.weight, keep, 0)
            if layer.bias is not None:
                layer.bias = self._prune_parameter_and_grad(layer.bias, keep, 0)
            removed = layer.out_channels - len(keep)
            layer.out_channels -= removed
            layer.in_channels -= removed
            layer.groups -= removed // width
            return layer

        prune_in_channels = prune_out_channels

        def get_in_channel_groups(self, layer):
            return 1

        def get_out_channel_groups(self, layer):
            return 1

    return WholeGroupConvPruner()


class PlanPruner:
    """Torch-Pruning's MetaPruner for ordinary and depthwise layers, plus whole-group pruning of grouped
    convolutions, step by step towards the plan's ratio."""

    def __init__(self, model, tp_pruner, cfg: PruneConfig, ratio: float, input_shape, grouped):
        self.model, self.tp_pruner, self.cfg, self.ratio = model, tp_pruner, cfg, ratio
        self.input_shape = input_shape
        self.original_groups = {conv: conv.groups for conv in grouped}
        self.done = 0

    def step(self) -> None:
        self.tp_pruner.step()
        self.done += 1
        if self.original_groups:
            self._prune_groups(self.ratio * self.done / self.cfg.steps)

    def _prune_groups(self, ratio: float) -> None:
        import math

        convs = list(self.original_groups)
        with whole_group_graph(self.model, convs, self.input_shape) as (graph, pruner):
            for conv in convs:
                width = conv.out_channels // conv.groups
                # Kept channels = kept groups × width must be a multiple of round_to.
                multiple = self.cfg.round_to // math.gcd(width, self.cfg.round_to)
                wanted = self.original_groups[conv] * (1 - ratio)
                keep = max(multiple, int(round(wanted / multiple)) * multiple)
                if keep >= conv.groups:
                    continue
                blocks = conv.weight.detach().reshape(conv.groups, -1).pow(2).sum(1)  # L2² of each group's filters
                drop = torch.argsort(blocks)[: conv.groups - keep].tolist()
                idxs = [block * width + j for block in sorted(drop) for j in range(width)]
                group = graph.get_pruning_group(conv, pruner.prune_out_channels, idxs)
                if graph.check_pruning_group(group):
                    group.prune()


@contextlib.contextmanager
def whole_group_graph(model: torch.nn.Module, convs: list[torch.nn.Conv2d], input_shape):
    """A DepGraph of ``model`` in which ``convs`` (grouped convolutions) lose whole groups when pruned.

    Yields:
        (graph, the grouped convolutions' pruner); the convolutions are plain ``Conv2d`` again afterwards.
    """
    tp = torch_pruning()
    pruner = _whole_group_pruner(tp)
    for conv in convs:
        conv.__class__ = _GroupedConv2d
    try:
        yield tp.DependencyGraph().build_dependency(model, torch.zeros(input_shape),
                                                    customized_pruners={_GroupedConv2d: pruner}), pruner
    finally:
        for conv in convs:
            conv.__class__ = torch.nn.Conv2d


def kept_whole(model: torch.nn.Module) -> dict[str, str]:
    """Layers Torch-Pruning cannot narrow correctly, by name, each with the reason; pruning leaves them whole.

    - Attention (a module with ``num_heads`` and query/key/value projections of its own, linear or convolutional:
      timm's ``Attention``, MaxViT's ``Attention2d``): DepGraph would cut across the heads' reshape, so query, key,
      value and projection keep their widths (and with them the embedding width they share).
    - A convolution or linear layer of a subclass with parameters beyond ``weight`` and ``bias`` (timm's
      ``ScaledStdConv2d`` and its per-channel gain): Torch-Pruning narrows only the two it knows.
    - A depthwise convolution with a channel multiplier (:func:`multiplier_convs`), with the layers feeding it.
    """
    kept: dict[str, str] = {}
    multiplied = multiplier_convs(model)
    for name, module in model.named_modules():
        if any(name.startswith(done + ".") for done in kept):
            continue
        # The attention itself (its own query/key/value projections, linear or convolutional as in MaxViT), not a
        # whole block that merely records its head count (Swin's, whose MLP stays prunable).
        if hasattr(module, "num_heads") and _PROJECTIONS & {child for child, _ in module.named_children()}:
            kept[name] = f"attention ({type(module).__name__}, {module.num_heads} heads): its head dimensions and " \
                         "the embedding width they share are kept whole"
            continue
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)) and type(module) not in (
                torch.nn.Conv2d, torch.nn.Linear, _GroupedConv2d):
            extra = sorted(n for n, _ in module.named_parameters(recurse=False) if n not in ("weight", "bias"))
            if extra:
                kept[name] = f"{type(module).__name__} with parameters Torch-Pruning does not narrow " \
                             f"({', '.join(extra)}): kept whole"
                continue
        if module in multiplied:
            kept[name] = f"depthwise convolution with a channel multiplier ({module.in_channels} → " \
                         f"{module.out_channels}): Torch-Pruning cannot narrow its input, so the layers feeding it " \
                         "keep their widths too"
    return kept


_PROJECTIONS = {"qkv", "qk", "kv", "q", "k", "v", "to_qkv", "to_q"}


def multiplier_convs(model: torch.nn.Module) -> list[torch.nn.Conv2d]:
    """Depthwise convolutions with a channel multiplier (one group per input, several outputs each: FastViT's patch
    embeddings and final convolution). Torch-Pruning narrows their inputs as if they were plain depthwise layers and
    reads their importance out of range, so they, and every layer whose outputs feed them, keep their widths."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and 1 < m.groups == m.in_channels
            and m.out_channels != m.in_channels]


def ignored_modules(model: torch.nn.Module, arch: str, input_shape=None, graph=None) -> list[torch.nn.Module]:
    """What no plan may narrow: the heads, every layer :func:`kept_whole` names, with their submodules, and the
    layers coupled to a :func:`multiplier_convs` input (found on ``graph``, or a dependency graph built at
    ``input_shape``, only when the model has such a convolution)."""
    roots = [*ARCHITECTURES.get(arch).head_modules(model),
             *(model.get_submodule(name) for name in kept_whole(model))]
    ignored = [module for root in roots for module in root.modules()]
    multiplied = multiplier_convs(model)
    if multiplied:
        tp = torch_pruning()
        if graph is None:
            graph = tp.DependencyGraph().build_dependency(model, torch.zeros(input_shape))
        for conv in multiplied:
            group = graph.get_pruning_group(conv, tp.pruner.function.prune_conv_in_channels, [0])
            ignored += [dep.target.module for dep, _ in group if graph.is_out_channel_pruning_fn(dep.handler)]
    return ignored


def make_pruner(model: torch.nn.Module, arch: str, cfg: PruneConfig, plan: dict, input_shape) -> PlanPruner:
    """A DepGraph MetaPruner for ``plan`` that never touches the classifier.

    A plan prunes every layer at channel ratio ``ratio`` except the first ``harder_layers``
    convolutions, which are pruned harder, at ``harder_ratio``. Rounding to multiples of 8 makes the MACs of a
    uniform ratio jump in steps (ResNet-50 at 32×32: 21.8% → 25.9% between ratios 0.500 and
    0.495), so mixing two neighbouring ratios layer by layer is what reaches a target within 5%.
    Grouped convolutions are left to :class:`PlanPruner`, which removes whole groups.
    """
    tp = torch_pruning()
    grouped = grouped_convs(model)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    per_layer = {conv: plan["harder_ratio"] for conv in convs[: plan.get("harder_layers", 0)] if conv not in grouped}
    tp_pruner = tp.pruner.MetaPruner(
        model,
        torch.zeros(input_shape),
        # A uniform ratio ranks channels by weight magnitude whatever prune.importance says: Taylor importance needs
        # gradients on data and is the knapsack's (pipeline.prune.channels); a latency budget's table check compares
        # its plans with this magnitude baseline.
        importance=estimator("l1" if cfg.importance == "l1" else "l2"),
        pruning_ratio=plan["ratio"],
        pruning_ratio_dict=per_layer or None,
        iterative_steps=cfg.steps,
        ignored_layers=[*ignored_modules(model, arch, input_shape), *grouped],
        round_to=cfg.round_to,
    )
    return PlanPruner(model, tp_pruner, cfg, plan["ratio"], input_shape, grouped)


def macs_after(model: torch.nn.Module, arch: str, cfg: PruneConfig, plan: dict, input_shape) -> int:
    """MACs of a copy of ``model`` pruned (all steps at once) according to ``plan``."""
    trial = copy.deepcopy(model).eval()
    try:
        pruner = make_pruner(trial, arch, cfg, plan, input_shape)
        for _ in range(cfg.steps):
            pruner.step()
        return count_macs(trial, input_shape)
    except (RuntimeError, ValueError, IndexError) as err:  # a layer DepGraph narrowed that its neighbours did not
        if isinstance(err, torch.OutOfMemoryError):
            raise
        raise StageError(f"Torch-Pruning cannot prune {arch}: a pruned copy fails to run ({type(err).__name__}: "
                         f"{str(err)[:200]})", fix="distill without pruning: set prune: null and distill.student to a "
                                               "smaller registry architecture (--set prune=null --set "
                                               "distill.student=mobilenet_v3_small), or choose a teacher "
                                               "Torch-Pruning can narrow") from None


def bisect_target(evaluate, low, high, target: float, good_enough: float, iterations: int, integer: bool = False):
    """Bisects a knob whose result falls as it grows; returns the (knob, value) pairs tried."""
    tried = []
    for _ in range(iterations):
        knob = (low + high) // 2 if integer else (low + high) / 2
        value = evaluate(knob)
        tried.append((knob, value))
        if abs(value - target) <= good_enough:
            break
        if value > target:
            low = knob + (1 if integer else 0)
        else:
            high = knob
        if integer and low >= high:
            break
    return tried


def find_plan(model: torch.nn.Module, arch: str, cfg: PruneConfig, input_shape, base_macs: int) -> tuple[dict, float]:
    """Finds the pruning plan whose MACs fraction is closest to ``cfg.macs_target``.

    First the uniform channel ratio is bisected; if rounding leaves the target between two
    neighbouring ratios, the number of leading convolutions pruned at the higher ratio is
    bisected too.

    Returns:
        (plan, achieved MACs fraction).
    """
    target, good_enough = cfg.macs_target, cfg.tolerance * cfg.macs_target / 4

    def uniform(ratio: float) -> float:
        return macs_after(model, arch, cfg, {"ratio": ratio, "harder_ratio": ratio}, input_shape) / base_macs

    tried = bisect_target(uniform, 0.0, 0.98, target, good_enough, iterations=14)
    ratio, fraction = min(tried, key=lambda kv: abs(kv[1] - target))
    best = ({"ratio": ratio, "harder_ratio": ratio, "harder_layers": 0}, fraction)
    if abs(fraction - target) <= good_enough:
        return best
    above = max((kv for kv in tried if kv[1] > target), key=lambda kv: kv[0], default=(0.0, 1.0))
    below = min((kv for kv in tried if kv[1] < target), key=lambda kv: kv[0], default=None)
    if below is None:
        return best
    convs = sum(1 for m in model.modules() if isinstance(m, torch.nn.Conv2d))

    def mixed(harder_layers: int) -> float:
        plan = {"ratio": above[0], "harder_ratio": below[0], "harder_layers": harder_layers}
        return macs_after(model, arch, cfg, plan, input_shape) / base_macs

    for harder_layers, value in bisect_target(mixed, 0, convs, target, good_enough, iterations=10, integer=True):
        if abs(value - target) < abs(best[1] - target):
            best = ({"ratio": above[0], "harder_ratio": below[0], "harder_layers": int(harder_layers)}, value)
    return best

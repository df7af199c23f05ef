"""The plan search: the knapsack over channel groups under a cost model, its repair against the full
prediction, and the nested path a budget is bisected on by measurement.

Generic over the cost: a *table* here is anything with ``groups`` (:class:`pipeline.prune.channels.ChannelGroup`)
and ``predict(widths)``: the latency model (:class:`pipeline.latency.model.LatencyTable`) or the exact MACs
(:class:`MacsCost`, the MACs target's knapsack with Taylor importance: the control that differs from the
latency budget in the cost alone).
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.prune import knapsack
from pipeline.prune.channels import ChannelGroup
from pipeline.latency.model import LayerModel


def solve_plan(table, importance: dict[str, np.ndarray], budget_ms: float,
               iterations: int = 8) -> dict[str, int] | None:
    """The widths that keep the most importance with a predicted latency ≤ ``budget_ms`` (None: unreachable).

    The layer model is bilinear in neighbouring groups' widths, so the knapsack's costs are made separable
    as HALP does: each group's cost is its change with the other groups at the last plan's widths; the plan
    is solved again until it stops changing. Each plan is then repaired against the *full* prediction
    (:func:`_repair`), and the repaired plan of most importance is returned.

    Why the repair: linearized around the unpruned network the separable costs overstate what deep cuts
    save (two neighbouring cuts share a layer), around a deep cut they understate it, and the iteration
    can swing between a plan over the budget and the narrowest plan; on ResNet-50 it returned a plan
    predicted at 0.08 ms for a 0.77 ms budget (0.6% of the MACs).
    """
    values = _values(table, importance)
    choice = [len(g.candidates) - 1 for g in table.groups]  # each group's candidate index
    narrowest = [0] * len(table.groups)
    if table.predict(_widths(table, narrowest)) > budget_ms:
        return None
    tried: list[list[int]] = []
    for _ in range(iterations):
        widths = _widths(table, choice)
        base = table.predict(widths)
        costs = [[table.predict({**widths, g.name: w}) - base for w in g.candidates] for g in table.groups]
        picked = knapsack.solve(values, costs, budget_ms - base)
        if picked is None or picked in tried:
            break
        tried.append(list(picked))
        choice = list(picked)
    best, best_value = None, -np.inf
    for start in tried or [narrowest]:
        repaired = _repair(table, values, start, budget_ms)
        value = sum(v[o] for v, o in zip(values, repaired))
        if value > best_value:
            best, best_value = repaired, value
    return _widths(table, best)


def _values(table, importance: dict[str, np.ndarray]) -> list[list[float]]:
    """Per group, the importance kept at each candidate width (its most important channels)."""
    values = []
    for group in table.groups:
        cumulative = np.concatenate([[0.0], np.cumsum(importance[group.name])])
        values.append([float(cumulative[w]) for w in group.candidates])
    return values


def _widths(table, options: list[int]) -> dict[str, int]:
    return {g.name: g.candidates[o] for g, o in zip(table.groups, options)}


def _options(table, widths: dict[str, int]) -> list[int]:
    return [g.candidates.index(widths[g.name]) for g in table.groups]


def nested_path(table, importance: dict[str, np.ndarray], through: dict[str, int]) -> list[dict[str, int]]:
    """Plans from the unpruned network to the narrowest, each one candidate narrower than the one before,
    passing through ``through``: from it, the steps up gaining most importance per predicted ms spent
    (reversed) and the steps down losing least per predicted ms saved.

    Each plan keeps a subset of the channels of every plan before it, so measured latency falls along the
    path whatever the table's errors: a budget can be bracketed and bisected on it by measurement alone.
    """
    values = _values(table, importance)
    start = _options(table, through)
    sides = []
    for direction in (+1, -1):
        options, plans = list(start), []
        predicted = table.predict(_widths(table, options))
        while (step := _best_step(table, values, options, predicted, direction, math.inf)) is not None:
            options[step[0]] += direction
            predicted = step[1]
            plans.append(_widths(table, options))
        sides.append(plans)
    return sides[0][::-1] + [dict(through)] + sides[1]


def next_on_path(predicted: list[float], measured: dict[int, float], budget_ms: float,
                 last_bracket: int | None) -> tuple[int | None, int]:
    """The path index to measure next, and the bracket it splits (its width in path steps).

    The bracket is the narrowest-side plan measured over the budget and the nearest plan past it measured
    under, else the path's end (priced by its prediction, and itself a candidate until measured). Inside
    it, the plan whose prediction, scaled by the measured/predicted ratio interpolated between the
    bracket's ends, is nearest the budget; when the last such guess did not halve the bracket, its middle
    (interpolation alone can creep along one end).

    Returns:
        (None, width) when there is nothing left to measure: the bracket holds no plan (two neighbouring
        plans straddle the budget, or the path's end measured over it), or no plan measured over it.
    """
    end = len(predicted) - 1
    over = [i for i, ms in measured.items() if ms > budget_ms]
    if not over:
        return None, 0  # the widest plan measured meets the budget: no wider one to try
    low = max(over)
    high = min((i for i, ms in measured.items() if i > low and ms <= budget_ms), default=end)
    choices = range(low + 1, high if high in measured else high + 1)
    width = high - low
    if not choices:
        return None, width
    if last_bracket is not None and width > math.ceil(last_bracket / 2):
        return choices[len(choices) // 2], width
    ratio_low = measured[low] / predicted[low] if predicted[low] > 0 else 1.0
    ratio_high = measured[high] / predicted[high] if high in measured and predicted[high] > 0 else ratio_low
    span = predicted[low] - predicted[high]

    def estimate(i: int) -> float:
        t = (predicted[low] - predicted[i]) / span if span > 0 else (i - low) / width
        return predicted[i] * (ratio_low + t * (ratio_high - ratio_low))

    return min(choices, key=lambda i: abs(estimate(i) - budget_ms)), width


def _repair(table, values: list[list[float]], options: list[int], budget_ms: float) -> list[int]:
    """``options`` made to fit and then to fill the budget by the full prediction: while over, the step down
    losing least importance per ms saved; then, while a step up fits, the one gaining most per ms spent."""
    options = list(options)
    predicted = table.predict(_widths(table, options))
    for direction in (-1, +1):
        while direction > 0 or predicted > budget_ms:
            step = _best_step(table, values, options, predicted, direction, budget_ms)
            if step is None:
                break
            options[step[0]] += direction
            predicted = step[1]
    return options


def _best_step(table, values: list[list[float]], options: list[int], predicted: float,
               direction: int, budget_ms: float) -> tuple[int, float] | None:
    """(group index, new prediction) of the best one-candidate step down (-1: least importance lost per ms
    saved) or up (+1: most gained per ms spent, fitting the budget); None when there is none."""
    best = None
    for index, option in enumerate(options):
        target = option + direction
        if not 0 <= target < len(values[index]):
            continue
        trial = table.predict(_widths(table, options[:index] + [target] + options[index + 1:]))
        if direction > 0 and trial > budget_ms:
            continue
        ms = (predicted - trial) * -direction  # saved (down) or spent (up)
        importance = abs(values[index][target] - values[index][option])
        if direction < 0:
            score = -(importance / ms) if ms > 0 else -math.inf  # least lost per ms saved scores highest
        else:
            score = importance / ms if ms > 0 else math.inf
        if best is None or score > best[0]:
            best = (score, index, trial)
    return None if best is None else (best[1], best[2])



class MacsCost:
    """A plan's MACs as a fraction of the unpruned network's, as :func:`pipeline.models.count_macs` counts them:
    the cost of the MACs target's knapsack. Not fitted: each layer's MACs are bilinear in the widths of the groups
    it joins, and the elementwise rest (BatchNorm, activations, adds) scales with the layers' outputs.

    Args:
        layers: The network's :class:`pipeline.latency.model.LayerModel` (its coefficients are not used).
        groups: The groups and candidate widths the plan chooses among.
        layer_share: The convolutions' and linear layers' share of the counted MACs (the rest is elementwise).
    """

    def __init__(self, layers: LayerModel, groups: list[ChannelGroup], layer_share: float = 1.0):
        self.layers, self.groups, self.layer_share = layers, groups, layer_share

    @classmethod
    def of(cls, model, arch: str, input_shape, groups: list[ChannelGroup]) -> "MacsCost":
        from pipeline.models import count_macs, layer_macs

        share = sum(layer_macs(model, input_shape).values()) / count_macs(model, input_shape)
        return cls(LayerModel.of(model, arch, input_shape, groups), groups, min(share, 1.0))

    def predict(self, widths: dict[str, int]) -> float:
        features = self.layers.features(widths)
        return float(self.layer_share * features[2:].sum() + (1 - self.layer_share) * features[1])


def macs_knapsack_plan(model, arch: str, cfg, input_shape, batches) -> tuple[dict[str, int], list[ChannelGroup], float]:
    """The MACs target's plan with Taylor importance: the latency budget's knapsack and repair with MACs as the
    cost (the control that differs from a latency budget in the objective alone).

    Each group may lose at most ``cfg.max_pruning_ratio`` of its channels (default 0.9: the latency budget's
    default, for the same reason).

    Args:
        cfg: The recipe's :class:`pipeline.core.recipe.PruneConfig` (``macs_target`` set, ``importance`` taylor).
        batches: Training batches for the Taylor importance.

    Returns:
        (widths, the groups, the plan's MACs fraction by the cost model).

    Raises:
        StageError: When even the narrowest plan allowed is above the target.
    """
    from dataclasses import replace

    from device.errors import StageError
    from pipeline.prune.channels import group_importance, prunable_groups

    groups = prunable_groups(model, arch, input_shape, cfg.round_to)
    bound = cfg.max_pruning_ratio if cfg.max_pruning_ratio is not None else 0.9
    allowed = [replace(g, candidates=tuple(w for w in g.candidates if w >= (1 - bound) * g.full - 1e-9)) for g in groups]
    cost = MacsCost.of(model, arch, input_shape, groups)
    cost.groups = allowed
    importance = group_importance(model, arch, input_shape, "taylor", batches)
    widths = solve_plan(cost, importance, cfg.macs_target)
    if widths is None:
        narrowest = cost.predict({g.name: g.candidates[0] for g in allowed})
        raise StageError(f"prune: a MACs target of {100 * cfg.macs_target:.1f}% is below the narrowest plan the "
                         f"knapsack may choose ({100 * narrowest:.1f}%)",
                         fix="raise prune.macs_target or prune.max_pruning_ratio, or lower prune.round_to")
    return widths, groups, cost.predict(widths)

"""The latency-budget plan as a multiple-choice knapsack, solved exactly on a discretized budget.

HALP (Shen et al., NeurIPS 2022) treats every channel as an item and needs its *augmented* knapsack to
keep channels in importance order (a layer keeps its k most important channels, never a scattered set).
Here an item is already a whole choice for one channel group — "keep the w most important channels",
for every candidate width w on ``round_to`` — and exactly one choice is taken per group: a multiple-choice
knapsack. The importance order is built into the items, so no augmentation is needed, and the dynamic
programme over the budget (cut into ``resolution`` steps) is exact for the discretized costs, where a
greedy by importance-per-ms is not (it can strand budget that a lower-ratio choice elsewhere would use).
Costs are rounded *up* to the step, so a plan the programme calls feasible is feasible in real costs.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def solve(values: Sequence[Sequence[float]], costs: Sequence[Sequence[float]], budget: float,
          resolution: int = 4000) -> list[int] | None:
    """Chooses one option per group, maximizing total value with total cost ≤ ``budget``.

    Args:
        values: Per group, the value of each option (kept importance).
        costs: Per group, the cost of each option (latency in ms; may be negative: a change against a
            reference).
        budget: The largest allowed total cost.
        resolution: Steps the budget (above the cheapest plan) is cut into; the solution is exact for costs
            rounded up to a step.

    Returns:
        The chosen option index per group, or None when even the cheapest choice of every group exceeds
        the budget.
    """
    if len(values) != len(costs) or any(len(v) != len(c) or not len(v) for v, c in zip(values, costs)):
        raise ValueError("values and costs need one non-empty, equally long option list per group")
    floors = [min(c) for c in costs]
    slack = budget - sum(floors)
    if slack < -1e-12:
        return None
    if not values:
        return []
    # Budget steps: relative to the slack above the cheapest plan, so the resolution is spent where choices differ.
    unit = slack / resolution if slack > 0 else 1.0
    steps = resolution if slack > 0 else 0
    best = np.zeros(steps + 1)  # best[b]: largest value of the groups so far with cost ≤ b steps
    choices = []
    for group_values, group_costs, floor in zip(values, costs, floors):
        options = []
        for value, cost in zip(group_values, group_costs):
            need = cost - floor
            options.append((float(value), 0 if need <= 1e-12 else int(math.ceil(need / unit - 1e-9))))
        table = np.full((len(options), steps + 1), -np.inf)
        for index, (value, need) in enumerate(options):
            if need <= steps:
                table[index, need:] = best[: steps + 1 - need] + value
        choice = np.argmax(table, axis=0)
        best = table[choice, np.arange(steps + 1)]
        choices.append((choice, [need for _, need in options]))
    if not np.isfinite(best[steps]):
        return None
    picked, remaining = [], steps
    for choice, needs in reversed(choices):
        option = int(choice[remaining])
        picked.append(option)
        remaining -= needs[option]
    return picked[::-1]


def brute_force(values: Sequence[Sequence[float]], costs: Sequence[Sequence[float]],
                budget: float) -> tuple[float, list[int]] | None:
    """The exact optimum by enumeration (tests: small cases only)."""
    import itertools

    best = None
    for combo in itertools.product(*(range(len(v)) for v in values)):
        cost = sum(costs[g][o] for g, o in enumerate(combo))
        value = sum(values[g][o] for g, o in enumerate(combo))
        if cost <= budget + 1e-12 and (best is None or value > best[0] + 1e-12):
            best = (value, list(combo))
    return best

"""The latency model: a table of measured whole-network changes per channel group, and a per-layer model
fitted to it that predicts a plan's latency (see :mod:`pipeline.latency` for why whole networks).

It holds no device code: :func:`build_table` takes any *meter* (an object with ``measure(models,
refresh)``, :class:`pipeline.latency.measure.Meter` on a real agent, a stand-in in the tests).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from torch import nn

from pipeline.prune.channels import ChannelGroup, at_widths

TABLE_FORMAT = "edgefold.latency-table/1"


@dataclass
class Measurement:
    """One sub-network's latency: the median over windows, each window's p50, and the CI of the median window."""

    p50_ms: float
    ci_ms: tuple[float, float]
    windows_ms: list[float]

    def to_json(self) -> dict[str, Any]:
        return {"p50_ms": self.p50_ms, "ci_ms": list(self.ci_ms), "windows_ms": self.windows_ms,
                "spread_ms": [min(self.windows_ms), max(self.windows_ms)]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Measurement":
        return cls(data["p50_ms"], tuple(data["ci_ms"]), list(data["windows_ms"]))



def _measured_widths(group: ChannelGroup, widths_per_group: int, context: int) -> list[int]:
    """``widths_per_group`` candidates spread over the range (always the narrowest and the full width), and the
    context."""
    candidates = list(group.candidates)
    picks = {candidates[int(round(i * (len(candidates) - 1) / max(widths_per_group - 1, 1)))]
             for i in range(widths_per_group)}
    return sorted(picks | {context})


def _layer_shapes(model: nn.Module, input_shape) -> dict[str, tuple[int, int, bool, int, int]]:
    """(in channels, out channels, depthwise, MACs, output elements) of every convolution and linear layer."""
    from pipeline.models import layer_macs

    shapes: dict[str, tuple[int, int, bool, int, int]] = {}
    macs = layer_macs(model, input_shape)
    for name, m in model.named_modules():
        if name not in macs:
            continue
        if isinstance(m, nn.Conv2d):
            # Torch-Pruning counts (in/groups · kernel) MACs plus one bias add per output element: divided out,
            # the output's size (the activations the layer writes) without a forward pass of our own.
            per_output = (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1] + (m.bias is not None)
            shapes[name] = (m.in_channels, m.out_channels, m.groups == m.in_channels > 1, macs[name],
                            macs[name] // per_output)
        else:
            shapes[name] = (m.in_features, m.out_features, False, macs[name], m.out_features)
    return shapes


# Seconds to make one network measurable, by runtime: the host's export (and Q/DQ for INT8) plus the device's
# build. Rough, and said to be: a Jetson Orin builds a ResNet-18/50-sized INT8 engine in about 20–60 s (each
# table point is an engine build there); ONNX Runtime opens a session in well under a second.
BUILD_SECONDS = {"tensorrt": 40.0, "onnxruntime": 1.0, "torch": 2.0}
JOB_OVERHEAD_S = 0.5  # submit, load from the engine cache, smoke inference, result: per window


def table_cost(groups: list[ChannelGroup], context: dict[str, int], target, runtime: str) -> dict[str, Any]:
    """How many networks (TensorRT engines or ONNX Runtime sessions) a budget search builds at most, the
    agent jobs it runs, and an estimate of the time, before anything is measured.

    Counts the table (the context and each group's measured widths), then the narrowest plan, the search's
    rounds, the check's networks and the held-out plans. Cached measurements are not rebuilt, so this is an
    upper bound.

    Args:
        target: The recipe's :class:`pipeline.core.recipe.LatencyTarget`.
        runtime: The job spec's runtime (``tensorrt``: each network is an engine build on the device).
    """
    table = 1 + sum(len(_measured_widths(g, target.widths_per_group, context[g.name])) - 1 for g in groups)
    networks = table + 1 + target.rounds + (1 if target.check else 0) + target.holdout
    jobs = networks * target.windows
    per_job = target.duration_s + JOB_OVERHEAD_S
    estimate = networks * BUILD_SECONDS.get(runtime, 1.0) + jobs * per_job
    return {"networks": networks, "table_networks": table, "jobs": jobs, "estimate_s": estimate,
            "unit": "TensorRT engines" if runtime == "tensorrt" else f"{runtime} sessions"}


@dataclass
class LayerModel:
    """A device latency model fitted to the table's measurements: ``T = c + Σ_l α_l·MACs_l + β·activations``.

    Each layer's MACs are bilinear in the widths of the two groups it joins (its input group and its output
    group), so the model prices cutting two neighbouring groups at once correctly where a sum of single-group
    changes counts the shared layers twice. ``α_l`` (time per MAC of each layer: a 1×1 or a small-spatial
    layer runs far from peak) and ``β`` (time per output element: the memory-bound part, BatchNorm, ReLU,
    residual adds) are fitted by non-negative least squares to every whole-network measurement, with a
    ridge pull of each ``α_l`` towards the network's mean so the fit stays defined with few measurements.

    **Latency is not smooth in the channel count.** A GPU kernel pads channels to its tile (Tensor Cores:
    multiples of 8, 16 or 32 by precision and kernel), so 33 channels cost what 64 cost and the time steps at
    the multiples. The model therefore never interpolates inside a step: a width enters every feature
    *padded* to ``kernel_multiple`` (``ceil(w / k)·k``), so predictions are piecewise constant between
    multiples and only the multiples themselves carry new information. Plans choose widths on ``round_to``
    (the candidates); with ``kernel_multiple`` equal to it (the default) every candidate is a step edge, and
    with a smaller ``round_to`` the model says that widths inside one step cost the same — the knapsack
    then keeps the step's widest width for free. A device whose steps are elsewhere is met by the search
    measuring plans, not by the model.
    """

    names: list[str]
    macs: np.ndarray
    elems: np.ndarray
    in_group: list[str | None]
    out_group: list[str | None]
    depthwise: list[bool]
    full: dict[str, int]
    coef: np.ndarray | None = None  # [c, β, α_1 … α_L] in ms per unit of the normalized features
    kernel_multiple: int = 1  # widths enter padded to this multiple (the kernels' channel tile)

    @classmethod
    def of(cls, model: nn.Module, arch: str, input_shape, groups: list[ChannelGroup],
           kernel_multiple: int = 1) -> "LayerModel":
        """Maps every layer to the groups whose widths scale its inputs and outputs (one probe per group)."""
        base = _layer_shapes(model, input_shape)
        names = list(base)
        in_group: list[str | None] = [None] * len(names)
        out_group: list[str | None] = [None] * len(names)
        for group in groups:
            if group.candidates[0] >= group.full:
                continue
            probe = _layer_shapes(at_widths(model, arch, input_shape, {group.name: group.candidates[0]}), input_shape)
            for i, name in enumerate(names):
                if probe[name][0] != base[name][0]:
                    in_group[i] = group.name
                if probe[name][1] != base[name][1]:
                    out_group[i] = group.name
        total_macs = sum(v[3] for v in base.values())
        total_elems = sum(v[4] for v in base.values())
        return cls(names, np.array([base[n][3] / total_macs for n in names]),
                   np.array([base[n][4] / total_elems for n in names]), in_group, out_group,
                   [base[n][2] for n in names], {g.name: g.full for g in groups}, kernel_multiple=kernel_multiple)

    def padded(self, width: int) -> int:
        """``width`` rounded up to the kernels' channel tile: what a step-wise kernel costs."""
        return -(-width // self.kernel_multiple) * self.kernel_multiple

    def features(self, widths: dict[str, int]) -> np.ndarray:
        """[1, activations, MACs_1 … MACs_L] of a plan (widths padded to ``kernel_multiple``), normalized by the
        unpruned network's totals."""
        def ratio(group):
            if group is None:
                return 1.0
            return self.padded(widths.get(group, self.full[group])) / self.padded(self.full[group])

        r_out = np.array([ratio(g) for g in self.out_group])
        r_in = np.array([1.0 if dw else ratio(g) for g, dw in zip(self.in_group, self.depthwise)])
        return np.concatenate([[1.0, float(np.sum(self.elems * r_out))], self.macs * r_in * r_out])

    def fit(self, samples: list[tuple[dict[str, int], float]], ridge: float = 0.05) -> "LayerModel":
        """Fits the coefficients to measured (widths, ms) pairs."""
        from scipy.optimize import lsq_linear

        x = np.array([self.features(w) for w, _ in samples])
        y = np.array([t for _, t in samples])
        full_ms = max(y)
        layers = len(self.names)
        # Ridge rows: each α_l pulled towards the time per MAC the whole network would have if MACs were all.
        prior = np.zeros((layers, layers + 2))
        prior[:, 2:] = np.eye(layers) * math.sqrt(ridge) * self.macs.mean()
        rhs = np.full(layers, math.sqrt(ridge) * self.macs.mean() * full_ms)
        result = lsq_linear(np.vstack([x, prior]), np.concatenate([y, rhs]), bounds=(0, np.inf))
        self.coef = result.x
        return self

    def predict(self, widths: dict[str, int]) -> float:
        return float(self.features(widths) @ self.coef)


@dataclass
class LatencyTable:
    """Latency changes per group and width against a measured context plan, and the layer model fitted to them."""

    context: dict[str, int]
    context_ms: Measurement
    groups: list[ChannelGroup]
    measured: dict[str, dict[int, Measurement]] = field(default_factory=dict)
    delta_ms: dict[str, list[float]] = field(default_factory=dict)  # per candidate width, smoothed
    model: LayerModel | None = None
    samples: list[tuple[dict[str, int], float]] = field(default_factory=list)
    also_ms: dict[str, Measurement] = field(default_factory=dict)  # networks measured beside the context

    def additive(self, widths: dict[str, int]) -> float:
        """The first-order prediction: the context's time plus each group's measured change (kept for the record)."""
        total = self.context_ms.p50_ms
        for group in self.groups:
            total += self.delta_ms[group.name][group.candidates.index(widths.get(group.name, group.full))]
        return total

    def predict(self, widths: dict[str, int]) -> float:
        """Predicted latency (ms) of a plan by the fitted layer model."""
        return self.model.predict(widths)

    def add(self, widths: dict[str, int], ms: float) -> None:
        """Adds a measured plan to the fit (the model gets data where the plans are)."""
        self.samples.append((dict(widths), ms))
        self.model.fit(self.samples)

    def to_json(self) -> dict[str, Any]:
        return {"format": TABLE_FORMAT, "context": self.context, "context_ms": self.context_ms.to_json(),
                "model": {"layers": self.model.names, "coef": [float(c) for c in self.model.coef],
                          "kernel_multiple": self.model.kernel_multiple,
                          "in_group": self.model.in_group, "out_group": self.model.out_group,
                          "fit_residual_ms": [t - self.predict(w) for w, t in self.samples]},
                "groups": {g.name: {"full": g.full, "candidates": list(g.candidates), "delta_ms": self.delta_ms[g.name],
                                    "measured": {str(w): m.to_json() for w, m in self.measured[g.name].items()}}
                           for g in self.groups}}


def build_table(model: nn.Module, arch: str, input_shape, groups: list[ChannelGroup], context: dict[str, int],
                meter, widths_per_group: int, kernel_multiple: int = 1,
                also: dict[str, nn.Module] | None = None) -> LatencyTable:
    """Measures the table around ``context``: each group at ``widths_per_group`` widths, the others at the context;
    fits the layer model to every measurement.

    Args:
        also: Networks measured afresh in the same call, interleaved with the context (a budget's reference),
            kept in ``table.also_ms``.
    """
    from scipy.optimize import isotonic_regression  # lazily: only a latency budget builds a table

    models: dict[Any, Any] = {"context": at_widths(model, arch, input_shape, context)}
    for group in groups:
        for width in _measured_widths(group, widths_per_group, context[group.name]):
            if width != context[group.name]:  # built by the meter one at a time
                models[(group.name, width)] = functools.partial(at_widths, model, arch, input_shape,
                                                                {**context, group.name: width})
    also = also or {}
    models.update(also)
    measured = meter.measure(models, refresh=["context"], **({"fresh": list(also)} if also else {}))
    table = LatencyTable(context, measured["context"], groups, model=LayerModel.of(model, arch, input_shape, groups,
                                                                                   kernel_multiple))
    table.also_ms = {name: measured[name] for name in also}
    table.samples.append((dict(context), measured["context"].p50_ms))
    for group in groups:
        at = {context[group.name]: measured["context"]}
        at.update({w: m for (key, m) in measured.items() if isinstance(key, tuple) and key[0] == group.name
                   for w in [key[1]]})
        table.samples += [({**context, group.name: w}, m.p50_ms) for w, m in at.items() if w != context[group.name]]
        table.measured[group.name] = dict(sorted(at.items()))
        xs = sorted(at)
        ys = [at[w].p50_ms - table.context_ms.p50_ms for w in xs]
        # The closest non-decreasing curve (pool adjacent violators): a wider group never costs less time;
        # a measured dip is noise.
        # Between measured widths, the change of the measured width at or above (the step the width pads to),
        # never a line through a step; the record's additive view only, the plan uses the layer model.
        above = [ys[min(np.searchsorted(xs, c), len(xs) - 1)] for c in group.candidates]
        delta = [float(d) for d in isotonic_regression(above).x]
        shift = delta[group.candidates.index(context[group.name])]
        table.delta_ms[group.name] = [d - shift for d in delta]
    table.model.fit(table.samples)
    return table


def restricted(table: LatencyTable, max_pruning_ratio: float) -> LatencyTable:
    """The table with each group's candidates cut to those removing at most ``max_pruning_ratio`` of its
    channels (the narrowest kept is the first candidate at or above the bound). It shares the fitted model
    and its samples with ``table``, so a plan added to either refits both."""
    if max_pruning_ratio >= 1:
        return table
    groups, delta_ms = [], {}
    for group in table.groups:
        bound = (1 - max_pruning_ratio) * group.full
        keep = [i for i, width in enumerate(group.candidates) if width >= bound - 1e-9]
        groups.append(replace(group, candidates=tuple(group.candidates[i] for i in keep)))
        delta_ms[group.name] = [table.delta_ms[group.name][i] for i in keep]
    return replace(table, groups=groups, delta_ms=delta_ms)


"""Latency tables measured on the target device, and the latency-budget plan solved from them (issue #16).

**What is measured.** For every prunable channel group of the model (Torch-Pruning's dependency groups:
a convolution's output channels together with everything coupled to them — its BatchNorm, the next
layers' inputs, every other layer on the same residual stream) the latency of the network with that
group at a few candidate widths (multiples of ``round_to``), all other groups held at a *context* plan.
Every measurement is an ordinary benchmark job of the deploy stage's runtime and precision for that
device, sent through :class:`device.client.AgentClient`, repeated over several interleaved windows; the
median window is used and the spread is kept.

**Why whole networks, not cut-out layers.** The sub-network measured for a group is the whole network in
its context, changed in that group only, and the table holds the *change* of latency against the context:

* the agent takes image-shaped models only (1 or 3 input channels: its smoke inference runs a real
  photograph through them), so a cut-out layer needs an adapter layer in front that costs time itself;
* the runtime fuses across layer boundaries (Conv+BN+ReLU+Add in ONNX Runtime, whole blocks in TensorRT)
  and each call has a fixed overhead of the order of a small layer's time: an isolated 1×1 or depthwise
  layer — exactly the memory-bound layers MACs misjudge — is timed with costs it does not have in the
  network, and a sum of isolated layers counts the call overhead once per layer;
* a change measured in context has neither problem; its price is that it is a small difference of two
  large times, so it is measured over several windows and smoothed (monotone in the width).

**From the table to a prediction.** A sum of the single-group changes counts every layer between two
groups twice (its time shrinks with the product of both widths): on ResNet-18 it predicted negative
times for deep cuts. The table's measurements are therefore fitted by a per-layer model
(:class:`LayerModel`: a fixed time, a time per MAC for each layer — bilinear in the widths of the two
groups it joins — and a time per activation), the knapsack's costs are made separable by holding the
other groups at the last plan (HALP's way), and the knapsack's plan is measured; when it misses, the
budget is bisected by measurement along a nested path of plans through it (:func:`plan_to_budget`).
The model is checked against measured full runs of the unpruned and of a MACs-pruned network
(:func:`check_table`), and the errors are recorded in the run.

Result documents are read in one place only, :func:`latency_ms`, because the agent's result schema is
being retyped.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import nn

from device.errors import ConfigError, EdgeFoldError, StageError
from device.files import write_json_atomic
from device.schema import parse_result
from pipeline import knapsack
from pipeline.log import progress_lines
from pipeline.manifest import sha256_json

TABLE_FORMAT = "edgefold.latency-table/1"


# ----------------------------------------------------------------------------------------- reading results
def latency_ms(result: dict[str, Any], batch_size: int) -> tuple[float, float, float]:
    """The median latency of one batch size in an agent's job result (device.schema.JobResult), with a
    95% interval for that one window: the standard error of a median is √(π/2)·σ/√n for a normal sample
    (the calls of one window; the table's spread across windows is kept beside it).

    Returns:
        (p50_ms, ci_low_ms, ci_high_ms).

    Raises:
        SchemaVersionError, ResultError: A result of another agent version, or not a result.
        StageError: When the result holds no run of ``batch_size``.
    """
    run = parse_result(result, "the latency table's job result").run(batch_size)
    if run is None:
        raise StageError(f"the agent's result holds no run at batch {batch_size}",
                         fix="this is a bug of the latency table's job spec; report it")
    half = 1.96 * math.sqrt(math.pi / 2) * run.latency_std_ms / math.sqrt(max(run.iterations, 1))
    return run.latency_p50_ms, run.latency_p50_ms - half, run.latency_p50_ms + half


# ----------------------------------------------------------------------------------------- channel groups
@dataclass(frozen=True)
class ChannelGroup:
    """One prunable dependency group, named by its root layer (the layer whose outputs it prunes)."""

    name: str
    full: int
    candidates: tuple[int, ...]  # widths the plan may choose, ascending, the full width last
    block: int = 1  # channels per group of a grouped convolution in this group: it loses whole blocks


def _tp():
    from pipeline.pruning import torch_pruning

    return torch_pruning()


def _graph(model: nn.Module, input_shape):
    return _tp().DependencyGraph().build_dependency(model, example_inputs=torch.zeros(input_shape))


def _classifier(model: nn.Module, arch: str) -> nn.Module:
    from pipeline.models import ARCHITECTURES

    return model.get_submodule(ARCHITECTURES.get(arch).classifier)


def _groups(model: nn.Module, arch: str, graph) -> Iterator[tuple[str, Any, Any]]:
    """(root name, root module, group) of every prunable group; the classifier's outputs are never one."""
    names = {module: name for name, module in model.named_modules()}
    for group in graph.get_all_groups(ignored_layers=[_classifier(model, arch)],
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
    path (:func:`pipeline.pruning.grouped_convs`): its widths are multiples of both ``round_to`` and
    the conv-group width.
    """
    from pipeline.pruning import grouped_convs

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


def _estimator(importance: str):
    """Torch-Pruning's group estimator for ``importance``.

    ``l1``/``l2``: group magnitude, divided by the group's mean (Torch-Pruning's default ``normalizer``), so
    every group's channels sum to its width. ``taylor``: for one batch's gradients, |Σ w·∂L/∂w| of each
    channel summed over the group's layers and *not* normalized (squared and averaged over batches by
    :func:`taylor_scores`).
    """
    tp = _tp()
    if importance == "taylor":
        return tp.importance.GroupTaylorImportance(group_reduction="sum", normalizer=None, multivariable=True)
    return tp.importance.GroupMagnitudeImportance(p=1 if importance == "l1" else 2)


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
    estimator = _estimator("taylor")
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
    from pipeline.pruning import grouped_convs

    if importance == "taylor" and batches is None:
        raise ConfigError("prune.importance taylor needs training batches", fix="use l2, or run it in the prune stage")
    groups = [(name, group) for name, _, group in _groups(model, arch, _graph(model, input_shape))]
    if importance == "taylor":
        scores = taylor_scores(model, arch, input_shape, batches, groups=groups)
    else:
        estimator = _estimator(importance)
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
    from pipeline.pruning import grouped_convs, whole_group_graph

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


# ----------------------------------------------------------------------------------------- measuring
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


class Meter:
    """Measures models on one agent with the deploy stage's job spec, cached by device, structure and runtime.

    Args:
        client: An open :class:`device.client.AgentClient`.
        spec: The job spec template (:func:`device_spec`); its ``artifact`` is replaced per model.
        key: What identifies the device and its runtime (fingerprint, agent, code of a loopback agent).
        cache: Directory of cached measurements (one JSON file per key).
        workdir: Where the exported models are written.
        windows: Interleaved windows per model.
        opset: ONNX opset of the exports (the export stage's).
    """

    def __init__(self, client, spec, key: dict[str, Any], cache: Path, workdir: Path, windows: int, opset: int,
                 input_shape, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)):
        self.client, self.spec, self.key, self.windows, self.opset = client, spec, key, windows, opset
        self.cache, self.workdir = Path(cache), Path(workdir)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.input_shape, self.log = tuple(input_shape), log
        self.jobs = 0
        self.reused = 0

    def _cache_key(self, model: nn.Module) -> str:
        from pipeline.checkpoint import capture_structure

        spec = self.spec.model_dump(mode="json", exclude={"label", "artifact"}, exclude_none=True)
        return sha256_json({"structure": capture_structure(model), "input": list(self.input_shape),
                            "device": self.key, "spec": spec, "windows": self.windows, "opset": self.opset})

    def measure(self, models: dict[Any, nn.Module | Callable[[], nn.Module]],
                refresh: Iterable[Any] = ()) -> dict[Any, Measurement]:
        """Measures every model (cached ones are read back); windows interleave across models, so a slow
        drift of the device spreads over all of them instead of biasing the ones measured last.

        Args:
            models: Models, or builders of them (called one at a time, so that only one is in memory).
            refresh: Names measured again, cache or not, whenever any other model is measured in this call:
                the reference the others are differences against (a table's context) must share their
                session. A context read from the cache had been measured while the host was busy, and a
                whole ResNet-50 table came out as differences against a time 1.7× too long.
        """
        from device.client import AgentError, JobTimeoutError
        from device.schema import JobSpec
        from pipeline.onnx_export import export_onnx

        results: dict[Any, Measurement] = {}
        pending: dict[Any, tuple[str, str]] = {}
        # Tables take minutes: a line with rate and ETA every 15 s.
        progress = progress_lines(len(models), "[   prune] latency: exporting or finding cached", "networks", self.log)
        refresh = set(refresh)
        for name, model in sorted(models.items(), key=lambda item: item[0] in refresh):  # references last
            progress.update()
            # A builder is called here and its model dropped once exported: a table of a ResNet-50 holds
            # a hundred sub-networks, ~10 GB if built up front.
            model = model if isinstance(model, nn.Module) else model()
            key = self._cache_key(model)
            cached = self._cached(key)
            if cached is not None and not (name in refresh and pending):
                results[name] = cached
                self.reused += 1
                continue
            if key not in {k for k, _ in pending.values()}:
                path = self.workdir / f"{key[:16]}.onnx"
                if not path.is_file() and self.spec.precision == "int8":  # timed as Q/DQ, as the agent runs it
                    fp32 = path.with_name(f"{path.stem}.fp32.onnx")
                    export_onnx(model, fp32, self.input_shape, self.opset)
                    quantize_for_timing(fp32, path, self.input_shape)
                    fp32.unlink()
                elif not path.is_file():
                    export_onnx(model, path, self.input_shape, self.opset)
                try:
                    artifact = self.client.upload(path)
                except AgentError as err:
                    raise _unreachable(err) from None
                pending[name] = (key, artifact)
            else:
                pending[name] = next(v for v in pending.values() if v[0] == key)
        progress.close()
        unique = {key: artifact for key, artifact in pending.values()}
        windows: dict[str, list[tuple[float, float, float]]] = {key: [] for key in unique}
        if unique:
            self.log(f"[   prune] latency: measuring {len(unique)} networks × {self.windows} windows on the agent")
        progress = progress_lines(len(unique) * self.windows, "[   prune] latency: measuring", "jobs", self.log)
        for _ in range(self.windows):
            submitted: dict[str, str] = {}
            read = 0
            try:
                for key, artifact in unique.items():
                    submitted[key] = self.client.submit(JobSpec.model_validate(
                        {**self.spec.model_dump(exclude_none=True), "artifact": artifact}))["id"]
                for key, job_id in submitted.items():
                    job = self.client.wait(job_id, timeout_s=(self.spec.timeout_s or 1800) + 120, poll_s=0.05)
                    read += 1
                    if job["state"] != "succeeded":
                        raise StageError(f"a latency-table job failed on the agent: {job.get('error')}",
                                         fix="see the agent's log; the deploy stage's runtime must run this model")
                    windows[key].append(latency_ms(job["result"], self.spec.batch_sizes[0]))
                    self.jobs += 1
                    progress.update()
            except JobTimeoutError as err:
                # The agent answers, so it is not "unreachable". The late job and the ones queued after it are
                # cancelled: left there, they would hold the agent's queue after the stage stopped.
                outcome = "; ".join(dict.fromkeys(self.client.abandon(j) for j in list(submitted.values())[read:]))
                raise StageError(f"prune: a latency-table job did not end: {err.message} ({outcome})",
                                 fix=err.fix) from None
            except AgentError as err:
                raise _unreachable(err) from None
            except StageError:
                for job_id in list(submitted.values())[read:]:
                    self.client.abandon(job_id)
                raise
        progress.close()
        for key, values in windows.items():
            ordered = sorted(values, key=lambda v: v[0])
            median = ordered[len(ordered) // 2]
            measurement = Measurement(float(np.median([v[0] for v in values])), (median[1], median[2]),
                                      [v[0] for v in values])
            write_json_atomic(self.cache / f"{key}.json", measurement.to_json())
            for name, (k, _) in pending.items():
                if k == key:
                    results[name] = measurement
        return results

    def _cached(self, key: str) -> Measurement | None:
        """The cached measurement of ``key``; None when there is none or it cannot be read (measured again).

        Entries written before they were written atomically can be truncated by a kill; one bad entry
        must cost one measurement, not every later run.
        """
        path = self.cache / f"{key}.json"
        if not path.is_file():
            return None
        try:
            return Measurement.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as err:
            self.log(f"[   prune] latency: warning: the cached measurement {path} is unreadable "
                     f"({type(err).__name__}: {err}); measuring it again")
            return None


def _unreachable(err) -> StageError:
    return StageError(f"prune: the latency table's agent is unreachable: {err.message}",
                      fix="start the agent (edgefold-agent serve) or pass EDGE=/DC=/DEVICES= for a reachable one; "
                          "with none of them set the loopback agent on this machine is started")


def device_spec(device_info: dict[str, Any], deploy_cfg, target, preprocess: dict[str, Any], label: str):
    """The job spec of a latency-table measurement: the deploy stage's runtime, precision and threads for this
    device (its own :func:`pipeline.jobs.job_spec`; the deployed rung's, INT8, unless
    ``target.precision`` is ``float``), with the table's batch size and short windows, no idle baseline and
    no telemetry (latency only)."""
    from device.schema import JobSpec
    from pipeline.rungs import DEPLOYED
    from pipeline.jobs import job_spec

    rung = DEPLOYED if target.precision == "deployed" else "student"
    base = job_spec(rung, "0" * 64, device_info, deploy_cfg, preprocess, label)
    return JobSpec.model_validate({**base.model_dump(exclude_none=True), "batch_sizes": [target.batch_size],
                                   "duration_s": target.duration_s, "warmup_iterations": target.warmup_iterations,
                                   "idle_s": 0.0, "telemetry": []})


def quantize_for_timing(fp32: Path, out: Path, input_shape) -> Path:
    """An INT8 Q/DQ copy of ``fp32`` whose *speed* is the deployed model's: ONNX Runtime's quantizer with the
    quantize stage's placement (Conv and the residual Add, symmetric, per channel), calibrated on a few
    random images — the scales are wrong for accuracy and irrelevant to latency.

    ModelOpt (the quantize stage's default) places Q/DQ the same way (Conv inputs, one input of each residual
    Add) but takes seconds per network; a table measures a hundred or more.
    """
    from pipeline.ort_quantize import quantize_ort

    calibration = np.random.default_rng(0).standard_normal((8, *input_shape[1:])).astype(np.float32)
    quantize_ort(fp32, out, calibration, "max", per_channel=True)
    return out


# ----------------------------------------------------------------------------------------- the table
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


@dataclass
class LayerModel:
    """A device latency model fitted to the table's measurements: ``T = c + Σ_l α_l·MACs_l + β·activations``.

    Each layer's MACs are bilinear in the widths of the two groups it joins (its input group and its output
    group), so the model prices cutting two neighbouring groups at once correctly where a sum of single-group
    changes counts the shared layers twice. ``α_l`` (time per MAC of each layer: a 1×1 or a small-spatial
    layer runs far from peak) and ``β`` (time per output element: the memory-bound part, BatchNorm, ReLU,
    residual adds) are fitted by non-negative least squares to every whole-network measurement, with a
    ridge pull of each ``α_l`` towards the network's mean so the fit stays defined with few measurements.
    """

    names: list[str]
    macs: np.ndarray
    elems: np.ndarray
    in_group: list[str | None]
    out_group: list[str | None]
    depthwise: list[bool]
    full: dict[str, int]
    coef: np.ndarray | None = None  # [c, β, α_1 … α_L] in ms per unit of the normalized features

    @classmethod
    def of(cls, model: nn.Module, arch: str, input_shape, groups: list[ChannelGroup]) -> "LayerModel":
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
                   [base[n][2] for n in names], {g.name: g.full for g in groups})

    def features(self, widths: dict[str, int]) -> np.ndarray:
        """[1, activations, MACs_1 … MACs_L] of a plan, normalized by the unpruned network's totals."""
        def ratio(group):
            return 1.0 if group is None else widths.get(group, self.full[group]) / self.full[group]

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
                          "in_group": self.model.in_group, "out_group": self.model.out_group,
                          "fit_residual_ms": [t - self.predict(w) for w, t in self.samples]},
                "groups": {g.name: {"full": g.full, "candidates": list(g.candidates), "delta_ms": self.delta_ms[g.name],
                                    "measured": {str(w): m.to_json() for w, m in self.measured[g.name].items()}}
                           for g in self.groups}}


def build_table(model: nn.Module, arch: str, input_shape, groups: list[ChannelGroup], context: dict[str, int],
                meter: Meter, widths_per_group: int) -> LatencyTable:
    """Measures the table around ``context``: each group at ``widths_per_group`` widths, the others at the context;
    fits the layer model to every measurement."""
    from scipy.optimize import isotonic_regression  # lazily: only a latency budget builds a table

    models: dict[Any, Any] = {"context": at_widths(model, arch, input_shape, context)}
    for group in groups:
        for width in _measured_widths(group, widths_per_group, context[group.name]):
            if width != context[group.name]:  # built by the meter one at a time
                models[(group.name, width)] = functools.partial(at_widths, model, arch, input_shape,
                                                                {**context, group.name: width})
    measured = meter.measure(models, refresh=["context"])
    table = LatencyTable(context, measured["context"], groups, model=LayerModel.of(model, arch, input_shape, groups))
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
        delta = [float(d) for d in isotonic_regression(np.interp(group.candidates, xs, ys)).x]
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


def solve_plan(table: LatencyTable, importance: dict[str, np.ndarray], budget_ms: float,
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


def _values(table: LatencyTable, importance: dict[str, np.ndarray]) -> list[list[float]]:
    """Per group, the importance kept at each candidate width (its most important channels)."""
    values = []
    for group in table.groups:
        cumulative = np.concatenate([[0.0], np.cumsum(importance[group.name])])
        values.append([float(cumulative[w]) for w in group.candidates])
    return values


def _widths(table: LatencyTable, options: list[int]) -> dict[str, int]:
    return {g.name: g.candidates[o] for g, o in zip(table.groups, options)}


def _options(table: LatencyTable, widths: dict[str, int]) -> list[int]:
    return [g.candidates.index(widths[g.name]) for g in table.groups]


def nested_path(table: LatencyTable, importance: dict[str, np.ndarray], through: dict[str, int]) -> list[dict[str, int]]:
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


def _repair(table: LatencyTable, values: list[list[float]], options: list[int], budget_ms: float) -> list[int]:
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


def _best_step(table: LatencyTable, values: list[list[float]], options: list[int], predicted: float,
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


# ----------------------------------------------------------------------------------------- the agent
@contextlib.contextmanager
def open_agent(devices, name: str, log: Callable[[str], None]) -> Iterator[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """An open client of the agent the latency budget names, its device info, and what identifies it.

    With no devices configured the loopback agent on this machine is started (as the deploy stage does)
    and stopped afterwards.

    Raises:
        ConfigError: When devices are configured and none is called ``name`` (name, group or role).
        StageError: When the agent is unreachable, saying how to make one reachable.
    """
    from device.client import AgentClient, AgentError
    from pipeline.codehash import code_sha256
    from pipeline.jobs import FINGERPRINT_KEYS

    loopback, tmp = None, None
    try:
        if not devices:
            from device.loopback import LoopbackAgent

            tmp = tempfile.mkdtemp(prefix="edgefold-latency-")
            try:
                loopback = LoopbackAgent(Path(tmp) / "agent").start()
            except EdgeFoldError as err:
                raise StageError(f"prune: no devices configured and the loopback agent did not start: {err.message}",
                                 fix=f"{err.fix}; or pass EDGE=/DC=/DEVICES= for a reachable agent") from None
            log(f"[   prune] latency: no EDGE=/DC=/DEVICES= given: the budget is measured on the loopback agent "
                f"at {loopback.url} (this machine), not on {name!r}")
            url, token, identity = loopback.url, loopback.token, {"agent": "loopback",
                                                                   "code": code_sha256(("device.jobrun",
                                                                                        "device.agent"))[0]}
        else:
            matches = ([d for d in devices if d.name == name] or [d for d in devices if d.group == name]
                       or [d for d in devices if d.role == name])
            if not matches:
                raise ConfigError(f"prune.latency.device {name!r} is none of the configured devices "
                                  f"({', '.join(d.name for d in devices)})",
                                  fix="name one of them (name, group or role), or pass EDGE=/DC=/DEVICES= with it")
            device = matches[0]
            url, token, identity = device.url, device.token(), {"agent": device.url}
        client = AgentClient(url, token, timeout_s=60)
        try:
            try:
                info = client.device()
            except AgentError as err:
                raise _unreachable(err) from None
            identity["fingerprint"] = {key: info.get(key) for key in FINGERPRINT_KEYS}
            yield client, info, identity
        finally:
            client.close()
    finally:
        if loopback is not None:
            loopback.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------- the plan
def _macs(model: nn.Module, arch: str, input_shape, widths: dict[str, int]) -> int:
    from pipeline.models import count_macs

    return count_macs(at_widths(model, arch, input_shape, widths), input_shape)


def plan_to_budget(model: nn.Module, arch: str, cfg, input_shape, meter: Meter,
                   log: Callable[[str], None], batches: Callable[[], Any] | None = None) -> dict[str, Any]:
    """The widths for ``cfg.latency``'s budget: table, knapsack, and a search by measurement along a nested path.

    The table ranks the choices (which group gives up channels for how much time), and round 1 measures the
    knapsack's plan for the budget. Far from the table's context the prediction can be off several-fold
    (on ResNet-50 a plan predicted at 0.83 ms measured 2.26 ms), and calibrating the knapsack's budget by
    secant steps failed there: a small change of that budget switches the plan's structure, and measured
    time was not monotone in it (0.265 → 0.332 ms, 0.275 → 0.168 ms). So the later rounds search a
    *nested* path through round 1's plan (:func:`nested_path`: each plan a subset of the channels of the
    one before, so measured time falls along it) by interpolation safeguarded by bisection
    (:func:`next_on_path`) until a plan measures within ``tolerance`` of the budget, the bracket closes,
    or ``rounds`` plans were measured. Every measurement is added to the table's fit, which refines the
    interpolation; re-measuring the whole table around each plan costs a table per round and oscillated
    on ResNet-18.

    Args:
        model: The unpruned model (not changed).
        cfg: The recipe's :class:`pipeline.recipe.PruneConfig` (``latency`` set).

    Returns:
        ``widths``, ``budget_ms``, ``unpruned``/``predicted``/``measured`` latencies, ``rounds`` (each with its
        plan, its position on the nested path, prediction and measurement), ``tables`` (the measured
        table, JSON), ``table`` (the one the plans were chosen from, ``max_pruning_ratio`` applied) and
        ``plans`` (every measured plan's MACs and latency, for the report's plot).

    Raises:
        StageError: When the budget is below the narrowest plan, or every measured plan missed it.
    """
    target = cfg.latency
    groups = prunable_groups(model, arch, input_shape, cfg.round_to)
    full = {g.name: g.full for g in groups}
    importance = group_importance(model, arch, input_shape, cfg.importance,
                                  batches() if cfg.importance == "taylor" and batches is not None else None)
    base_macs = _macs(model, arch, input_shape, full)
    log(f"[   prune] latency: {len(groups)} channel groups; measuring the table around the unpruned network")
    # The unpruned network is the table's context, measured in the table's own session: the budget's
    # reference and the table's changes share one moment of the device.
    measured_table = build_table(model, arch, input_shape, groups, full, meter, target.widths_per_group)
    # The plans choose among the candidates max_pruning_ratio allows; the table measures all of them (its
    # cache is shared by every bound).
    table = restricted(measured_table, target.max_pruning_ratio)
    unpruned = table.context_ms
    budget = target.ms if target.ms is not None else target.ratio * unpruned.p50_ms
    log(f"[   prune] latency: unpruned {unpruned.p50_ms:.3f} ms (windows {min(unpruned.windows_ms):.3f}–"
        f"{max(unpruned.windows_ms):.3f}); budget {budget:.3f} ms")
    rounds, plans = [], [{"plan": "unpruned", "macs_fraction": 1.0, "measured_ms": unpruned.to_json()}]
    narrowest_widths = {g.name: g.candidates[0] for g in table.groups}
    narrowest = table.predict(narrowest_widths)
    if budget < narrowest:  # the prediction is extrapolated this far out: measured before refusing
        narrowest = meter.measure({"narrowest": at_widths(model, arch, input_shape, narrowest_widths)})["narrowest"].p50_ms
        table.add(narrowest_widths, narrowest)
        if budget < narrowest:
            raise StageError(f"prune: a latency of {budget:.3f} ms is below the narrowest plan's measured "
                             f"{narrowest:.3f} ms on this device",
                             fix="raise prune.latency.ratio/ms, lower prune.round_to, or raise "
                                 "prune.latency.max_pruning_ratio")
    # Round 1: the knapsack's plan for the budget. After it, the plans measured lie on a nested path through
    # it (each plan a subset of the one before): measured time is monotone along it, so the budget is
    # bisected there by measurement, whatever the table's errors far from its context.
    first = solve_plan(table, importance, budget) or narrowest_widths
    path, on_path, bracket, closed = None, {}, None, False
    for index in range(target.rounds):
        position = None
        if index == 0:
            widths = first
        else:
            if path is None:
                path = nested_path(table, importance, first)
                rounds[0].update(path_position=path.index(first), path_length=len(path))
                # The narrowest plan, if measured before, stays a candidate: measured as a round (from the
                # meter's cache) it can be chosen.
                on_path = {0: unpruned.p50_ms, rounds[0]["path_position"]: rounds[0]["measured_ms"]["p50_ms"]}
            position, bracket = next_on_path([table.predict(w) for w in path], on_path, budget, bracket)
            if position is None:
                closed = True  # nothing left to measure: more rounds would not help
                break
            widths = path[position]
        predicted = table.predict(widths)
        measured = meter.measure({"plan": at_widths(model, arch, input_shape, widths)})["plan"]
        macs_fraction = _macs(model, arch, input_shape, widths) / base_macs
        rounds.append({"round": index + 1, "path_position": position, "path_length": len(path) if path else None,
                       "widths": widths, "predicted_ms": predicted, "additive_ms": table.additive(widths),
                       "measured_ms": measured.to_json(), "macs_fraction": macs_fraction})
        table.add(widths, measured.p50_ms)
        if position is not None:
            on_path[position] = measured.p50_ms
        plans.append({"plan": f"round {index + 1}", "macs_fraction": macs_fraction,
                      "predicted_ms": predicted, "measured_ms": measured.to_json()})
        where = "knapsack" if index == 0 else f"path {position}/{len(path) - 1}"
        log(f"[   prune] latency round {index + 1} ({where}): plan predicted {predicted:.3f} ms, measured "
            f"{measured.p50_ms:.3f} ms (budget {budget:.3f}), {100 * macs_fraction:.1f}% of the MACs")
        if abs(measured.p50_ms - budget) <= target.tolerance * budget:
            break
    # The measured plan closest to the budget without exceeding it by more than the tolerance.
    meeting = [i for i, r in enumerate(rounds) if r["measured_ms"]["p50_ms"] <= budget * (1 + target.tolerance)]
    if not meeting:
        raise StageError(
            f"prune: every plan measured above the budget of {budget:.3f} ms ± {100 * target.tolerance:.0f}% "
            f"(closest {min(r['measured_ms']['p50_ms'] for r in rounds):.3f} ms after {len(rounds)} rounds)",
            fix="raise prune.latency.ratio/ms or prune.latency.max_pruning_ratio, or lower prune.round_to: the "
                "narrowest plan allowed measured over the budget" if closed else
                "raise prune.latency.rounds or prune.latency.windows (a noisy device), or prune.latency.tolerance")
    best = max(meeting, key=lambda i: rounds[i]["measured_ms"]["p50_ms"])
    chosen = rounds[best]
    shortfall = 1 - chosen["measured_ms"]["p50_ms"] / budget
    if shortfall > 3 * target.tolerance and chosen["widths"] != full:  # under: accuracy the budget paid for is lost
        over = [f"{r['measured_ms']['p50_ms']:.3f}" for i, r in enumerate(rounds) if i not in meeting]
        raise StageError(
            f"prune: no measured plan came near the budget of {budget:.3f} ms: the closest under it measured "
            f"{chosen['measured_ms']['p50_ms']:.3f} ms ({100 * shortfall:.0f}% below), those over it "
            f"{', '.join(over) or 'none'} ms, after {len(rounds)} rounds"
            + (": the budget falls between two neighbouring plans of the search" if closed else ""),
            fix="widen prune.latency.tolerance or lower prune.round_to (finer steps between plans)" if closed else
                "raise prune.latency.rounds or prune.latency.windows (a noisy device), or widen prune.latency.tolerance")
    plans[1 + best]["chosen"] = True
    # The plans the final table offers around the budget (predicted only), for the MACs-against-latency plot.
    sweep = []
    for factor in (0.7, 0.8, 0.9, 1.1, 1.25, 1.5):
        option = solve_plan(table, importance, budget * factor)
        if option is not None:
            sweep.append({"budget_ms": budget * factor, "predicted_ms": table.predict(option),
                          "macs_fraction": _macs(model, arch, input_shape, option) / base_macs})
    return {"widths": chosen["widths"], "budget_ms": budget, "unpruned_ms": unpruned.to_json(),
            "predicted_ms": chosen["predicted_ms"], "measured_ms": chosen["measured_ms"],
            "macs_fraction": chosen["macs_fraction"], "chosen_round": chosen["round"],
            "rounds": rounds, "tables": [measured_table.to_json()], "table": table, "groups": groups,
            "plans": plans, "sweep": sweep, "base_macs": base_macs, "importance": importance}


def check_table(model: nn.Module, arch: str, cfg, input_shape, meter: Meter, search: dict[str, Any],
                log: Callable[[str], None]) -> dict[str, Any]:
    """Predicted against measured latency of the unpruned and of a MACs-pruned network (the table's error).

    The MACs-pruned network is the MACs path's own plan (:func:`pipeline.pruning.find_plan`) at
    ``check_macs_target``, by default the chosen plan's MACs fraction (half the MACs when the plan kept
    almost everything).
    """
    from pipeline.pruning import find_plan, make_pruner

    table: LatencyTable = search["table"]
    groups = search["groups"]
    # At the plan's own MACs by default; a plan that kept (almost) everything is checked against half the MACs,
    # so that the check still exercises a pruned network.
    fraction = cfg.latency.check_macs_target or (search["macs_fraction"] if search["macs_fraction"] < 0.95 else 0.5)
    macs_cfg = cfg.model_copy(update={"macs_target": fraction, "latency": None, "steps": 1})
    macs_plan, achieved = find_plan(model, arch, macs_cfg, input_shape, search["base_macs"])
    macs_model = copy.deepcopy(model).eval()
    make_pruner(macs_model, arch, macs_cfg, macs_plan, input_shape).step()
    macs_widths = widths_of(macs_model, groups)
    full = {g.name: g.full for g in groups}
    for name, width in macs_widths.items():  # the MACs plan rounds too; a width off the table is interpolated
        group = next(g for g in groups if g.name == name)
        if width not in group.candidates:
            macs_widths[name] = min(group.candidates, key=lambda c: abs(c - width))
    measured = meter.measure({"macs": macs_model})["macs"]
    checks = {}
    for label, widths, value in (("unpruned", full, Measurement.from_json(search["unpruned_ms"])),
                                 ("macs_pruned", macs_widths, measured),
                                 ("plan", search["widths"], Measurement.from_json(search["measured_ms"]))):
        predicted = table.predict(widths)
        checks[label] = {"predicted_ms": predicted, "measured_ms": value.to_json(),
                         "error": (predicted - value.p50_ms) / value.p50_ms}
    checks["macs_pruned"].update(macs_fraction=achieved, plan=macs_plan)
    log("[   prune] latency table check: " + "; ".join(
        f"{k} predicted {v['predicted_ms']:.3f} ms, measured {v['measured_ms']['p50_ms']:.3f} ms "
        f"({100 * v['error']:+.1f}%)" for k, v in checks.items()))
    return checks


def step_widths(groups: list[ChannelGroup], final: dict[str, int], step: int, steps: int, round_to: int) -> dict[str, int]:
    """The widths after ``step`` of ``steps`` iterative steps: the way to the plan cut evenly, on ``round_to``."""
    out = {}
    for group in groups:
        goal = group.full - (group.full - final[group.name]) * step / steps
        out[group.name] = final[group.name] if step == steps else min(
            (c for c in group.candidates if c >= final[group.name]), key=lambda c: abs(c - goal))
    return out


def plot_plans(plans: list[dict[str, Any]], sweep: list[dict[str, Any]], budget_ms: float, path: Path) -> Path | None:
    """MACs against measured latency of the candidate plans, the chosen one marked (a PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    if sweep:
        ax.plot([100 * s["macs_fraction"] for s in sweep], [s["predicted_ms"] for s in sweep], "o:", color="grey",
                label="knapsack plans at other budgets (predicted)")
    for plan in plans:
        m = plan["measured_ms"]
        spread = [[m["p50_ms"] - m["spread_ms"][0]], [m["spread_ms"][1] - m["p50_ms"]]]
        chosen = plan.get("chosen")
        ax.errorbar([100 * plan["macs_fraction"]], [m["p50_ms"]], yerr=spread, fmt="*" if chosen else "o",
                    markersize=12 if chosen else 6, label=f"{plan['plan']} (measured)")
    ax.axhline(budget_ms, color="red", linestyle="--", linewidth=1, label="budget")
    ax.set_xlabel("MACs (% of the unpruned network)")
    ax.set_ylabel("latency on the device (ms)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

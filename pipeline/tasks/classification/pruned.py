"""Classification's part of the prune stage (:class:`pipeline.train.hooks.PruneHooks`): structured channel pruning
with Torch-Pruning (DepGraph) to a MACs target or a latency budget.

A latency budget (``prune.latency``) is measured on the named device's agent: a latency table per
channel group, a knapsack over group importance under the budget, and the chosen plan measured
(see :mod:`pipeline.latency`; loaded by name, only then). The MACs target works as before:

Torch-Pruning takes a channel ratio, not a MACs budget, so the ratio is found by bisection
on throw-away copies; channel counts are rounded to the recipe's multiple because odd counts
defeat Tensor Cores (a pruned model with odd widths is often *slower* in TensorRT).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from device.errors import StageError
from pipeline.prune.channels import WidthPruner
from pipeline.core.log import log
from pipeline.core.recipe import PruneConfig
from pipeline.latency.search import macs_knapsack_plan
from pipeline.models import ARCHITECTURES, as_exported, count_macs, count_parameters, layer_macs
from pipeline.prune.ratio import find_plan, kept_whole, make_pruner
from pipeline.tasks.classification.recipe import pruning_skipped
from pipeline.tasks.classification.scores import assess, recorded_scores
from pipeline.tasks.classification.train import evaluate, fit, recalibrate_if_needed
from pipeline.tasks.classification.training import ClassificationModels
from pipeline.train.hooks import PruneHooks, Scored
from pipeline.tasks.classification.images import data_set, image_batches, preprocess_of

# The latency path, loaded by name (importlib) and only for a latency budget: the code hash follows imports,
# lazy ones included, and that path reaches the agent, its runners and the ONNX export. Declared as a code
# root for that mode alone (ClassificationPrune.roots), so a MACs target is not re-run by an edit there.
LATENCY_PATH = "pipeline.latency.budget"


class ClassificationPrune(ClassificationModels, PruneHooks):
    """Classification's pruning: see the module's docstring."""

    def skipped(self, ctx):
        return pruning_skipped(ctx.recipe)

    def roots(self, ctx):
        """The MACs path is this module's own imports; a latency budget adds the latency path and the agent's job
        process, which times the networks without being imported here."""
        return (LATENCY_PATH, "device.jobs.jobrun", "device.service.agent") if ctx.recipe.prune.latency is not None else ()

    def keys(self, ctx, stage):
        keys = {"preprocess": preprocess_of(ctx).to_dict()}
        if ctx.recipe.prune.latency is not None:
            # The budget is measured with the deploy stage's runtime on these devices: a change plans again.
            deploy = ctx.recipe.deploy
            keys.update(devices=[d.public() for d in ctx.devices],
                        deploy={"runtime": deploy.runtime, "threads": deploy.threads}, opset=ctx.recipe.export.opset)
            if ctx.recipe.prune.latency.reference:  # the budget is of that network's latency: its bytes count
                from device.files import sha256_file

                keys["reference_sha256"] = sha256_file(ctx.recipe.prune.latency.reference)
        return keys

    def prune(self, ctx, start, workdir):
        cfg, arch, input_shape = ctx.recipe.prune, start.saved["arch"], preprocess_of(ctx).input_shape(1)
        model, folded = _exported_form(start.model, arch)
        start.model = model
        base_macs, base_params = count_macs(model, input_shape), count_parameters(model)
        whole = _kept_whole(model)
        plan, pruner, latency_metrics = _plan(ctx, workdir, model, arch, cfg, input_shape, base_macs)
        before_shapes, before_macs = _conv_shapes(model), layer_macs(model, input_shape)
        history = []
        for step in range(cfg.steps):
            pruner.step()
            if cfg.finetune and cfg.finetune.epochs:
                history += _finetune(ctx, model, cfg, step)
        fraction = count_macs(model, input_shape) / base_macs
        if cfg.macs_target is not None and abs(fraction - cfg.macs_target) > cfg.tolerance * cfg.macs_target:
            raise StageError(
                f"pruned model has {100 * fraction:.1f}% of the teacher's MACs; target {100 * cfg.macs_target:.1f}% "
                f"± {100 * cfg.tolerance:.0f}% (relative)",
                fix="raise prune.tolerance, lower prune.round_to, or choose a reachable macs_target"
                    + (f" ({len(whole)} layers are kept whole and bound how far it can go: "
                       f"{', '.join(w['layer'] for w in whole[:3])}…)" if whole else ""),
            )
        unpruned = unpruned_layers(before_shapes, model, arch, cfg.round_to)
        if unpruned:
            log(f"prune: note: {len(unpruned)} prunable layers kept every channel; e.g. {unpruned[0]['layer']}: "
                f"{unpruned[0]['reason']}")
        concentration = macs_concentration(before_macs, layer_macs(model, input_shape))
        if concentration["warning"]:
            log(f"prune: note: {concentration['warning']}")
        odd = _channels_off_multiple(model, arch, cfg.round_to)
        if odd:
            log(f"prune: note: {len(odd)} layers keep channel counts that are not multiples of {cfg.round_to} "
                f"(unpruned originals): {odd[:3]}")
        start.saved.update(folded=folded, pruned_from="teacher", plan=plan)
        return {"plan": plan, "macs_fraction": fraction, "params_fraction": count_parameters(model) / base_params,
                "layers_off_multiple": len(odd), "unpruned_layers": unpruned, "kept_whole": whole,
                "macs_concentration": concentration, "history": history, "folded": folded,
                **({"latency": latency_metrics} if latency_metrics is not None else {})}

    def assess(self, ctx, start, workdir):
        test = image_batches(ctx, "test", ctx.recipe.evaluate.batch_size)
        metrics = evaluate(start.model, test, ctx.device, "pruned eval", save_predictions=workdir / "predictions.npy")
        start.model.cpu()
        return Scored({**recorded_scores(metrics), "sanity": assess(metrics, data_set(ctx).classes)},
                      {"predictions": workdir / "predictions.npy"})

    def summary(self, stage, metrics):
        if stage != "prune":
            return super().summary(stage, metrics)
        return (f"{100 * metrics['macs_fraction']:.1f}% of the teacher's MACs ({metrics['macs_g']:.3f} G), "
                f"{metrics['params_m']:.2f} M params, top-1 before distillation {100 * metrics['top1']:.2f}%")


def _plan(ctx, workdir: Path, model: torch.nn.Module, arch: str, cfg: PruneConfig, input_shape, base_macs: int):
    """The recipe's plan and the pruner that carries it out: a latency budget's (measured on the device), a MACs
    knapsack by Taylor importance, or a channel ratio bisected to the MACs target.

    Returns:
        (plan recorded in the checkpoint, pruner, the ``latency`` metrics or None).
    """
    def train_batches():  # for the Taylor importance: the loss change of removing a channel, on training data
        return image_batches(ctx, "train", 64, shuffle=True, seed=cfg.seed)

    if cfg.latency is not None:
        import importlib

        widths, budget_ms, groups, metrics = importlib.import_module(LATENCY_PATH).latency_plan(
            ctx, workdir, model, arch, cfg, input_shape, train_batches)
        plan = {"widths": widths, "latency_budget_ms": budget_ms}
        return plan, WidthPruner(model, arch, cfg, groups, widths, input_shape, train_batches), metrics
    if cfg.importance == "taylor":
        # The latency budget's knapsack with MACs as the cost: the control for "latency as the objective".
        widths, groups, predicted = macs_knapsack_plan(model, arch, cfg, input_shape, train_batches())
        log(f"prune: knapsack over {len(groups)} channel groups by Taylor importance → {100 * predicted:.1f}% of "
            f"the teacher's MACs (target {100 * cfg.macs_target:.1f}%)")
        plan = {"widths": widths, "macs_target": cfg.macs_target, "importance": "taylor"}
        return plan, WidthPruner(model, arch, cfg, groups, widths, input_shape, train_batches), None
    plan, predicted = find_plan(model, arch, cfg, input_shape, base_macs)
    harder = (f" ({plan['harder_ratio']:.3f} on the first {plan['harder_layers']} convolutions)"
              if plan.get("harder_layers") else "")
    log(f"prune: channel ratio {plan['ratio']:.3f}{harder} → {100 * predicted:.1f}% of the teacher's MACs "
        f"(target {100 * cfg.macs_target:.1f}%)")
    return plan, make_pruner(model, arch, cfg, plan, input_shape), None


def _finetune(ctx, model: torch.nn.Module, cfg: PruneConfig, step: int) -> list[dict]:
    """Fine-tunes between pruning steps (``prune.finetune``), BatchNorm statistics re-estimated where it asks."""
    tune = cfg.finetune
    train = image_batches(ctx, "train", tune.batch_size, shuffle=True, augment=tune.augment, seed=tune.seed + step,
                        drop_last=True)

    def loss_fn(logits, batch):
        return F.cross_entropy(logits, batch.labels, label_smoothing=tune.label_smoothing)

    history = fit(model, train, tune, loss_fn, ctx.device, f"prune step {step + 1}/{cfg.steps}")
    recalibrate_if_needed(model, tune, lambda: image_batches(ctx, "train", 256, shuffle=True, seed=tune.seed),
                          ctx.device, "pruned")
    model.cpu()
    return history


def _exported_form(model: torch.nn.Module, arch: str) -> tuple[torch.nn.Module, bool]:
    """The teacher as it is exported (:func:`pipeline.models.as_exported`): Torch-Pruning cannot narrow parallel
    branches it sees summed, so a re-parameterisable net is pruned, and then fine-tuned, folded."""
    model, folded = as_exported(model, arch)
    if folded:
        log(f"prune: {arch} pruned in its inference form (train-time branches folded, as it is exported); the "
            "student is fine-tuned in that form")
    return model, folded


def _kept_whole(model: torch.nn.Module) -> list[dict]:
    """The layers :func:`pipeline.prune.ratio.kept_whole` names, as the stage records them, said once in the log."""
    whole = [{"layer": name, "reason": reason} for name, reason in kept_whole(model).items()]
    if whole:
        log(f"prune: {len(whole)} layers kept whole, as the classifier is; e.g. {whole[0]['layer']}: "
            f"{whole[0]['reason']}")
    return whole


def _conv_shapes(model: torch.nn.Module) -> dict[str, tuple[int, int, int]]:
    return {name: (m.in_channels, m.out_channels, m.groups) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Conv2d)}


def unpruned_layers(before: dict[str, tuple[int, int, int]], model: torch.nn.Module, arch: str,
                    round_to: int) -> list[dict]:
    """Convolutions the plan left at full width, each with the reason (nothing stays whole silently).

    The usual reason is rounding: a grouped convolution whose groups are ``round_to`` channels wide (or
    narrower) cannot lose channels inside a group without leaving its width off the multiple, so
    Torch-Pruning keeps it whole, together with every layer coupled to it (its producer, its
    BatchNorm, a squeeze-excitation block), and the MACs target is met by squeezing the rest harder.
    """
    after = _conv_shapes(model)
    kept = []
    for name, (cin, cout, groups) in before.items():
        if after.get(name, (cin, cout, groups))[1] != cout or cout <= round_to:
            continue
        width = cout // groups if groups else cout
        if 1 < groups < cout and width <= round_to:
            reason = (f"grouped convolution, {groups} groups of {width} channels: with round_to {round_to} a group "
                      f"can only be kept whole (set prune.round_to to a divisor of {width} below it, e.g. "
                      f"{max(1, width // 2)}, to prune inside groups)")
        elif groups == cout and groups > 1:
            reason = "depthwise convolution coupled to a layer the plan kept whole"
        else:
            reason = "coupled (residual, concatenation or attention) to a layer the plan kept whole, or the ratio " \
                     "rounded back to the full width"
        kept.append({"layer": name, "channels": cout, "groups": groups, "reason": reason})
    return kept


def macs_concentration(before: dict[str, int], after: dict[str, int], top: int = 3,
                       share: float = 0.5) -> dict:
    """Which layers the MACs cut came from; a warning when ``top`` layers gave more than ``share`` of it.

    A plan that reaches its target by gutting a few layers (the residual stream of a network whose
    grouped layers stayed whole) usually costs more accuracy than one spread over the network.
    """
    removed = {name: before[name] - after.get(name, 0) for name in before if before[name] > after.get(name, 0)}
    total = sum(removed.values())
    ranked = sorted(removed.items(), key=lambda kv: -kv[1])[:top]
    top_share = sum(v for _, v in ranked) / total if total else 0.0
    warning = None
    if total and top_share > share and len(removed) > top:
        warning = (f"{100 * top_share:.0f}% of the MACs removed came from {top} of {len(removed)} pruned layers "
                   f"({', '.join(name for name, _ in ranked)}): the cut is concentrated")
    return {"removed_g": total / 1e9, "top_layers": [{"layer": n, "removed_g": v / 1e9} for n, v in ranked],
            "top_share": top_share, "warning": warning}


def _channels_off_multiple(model: torch.nn.Module, arch: str, multiple: int) -> list[str]:
    heads = ARCHITECTURES.get(arch).head_modules(model)
    odd = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Conv2d) and module.out_channels % multiple:
            odd.append(f"{name}={module.out_channels}")
        elif isinstance(module, torch.nn.Linear) and all(module is not head for head in heads) \
                and module.out_features % multiple:
            odd.append(f"{name}={module.out_features}")
    return odd

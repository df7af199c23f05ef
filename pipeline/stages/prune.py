"""prune stage: structured channel pruning with Torch-Pruning (DepGraph) to a MACs target.

Torch-Pruning takes a channel ratio, not a MACs budget, so the ratio is found by bisection
on throw-away copies; channel counts are rounded to the recipe's multiple because odd counts
defeat Tensor Cores (a pruned model with odd widths is often *slower* in TensorRT).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from device.errors import StageError, require
from pipeline.checkpoint import load_checkpoint, save_checkpoint
from pipeline.models import ARCHITECTURES, count_macs, count_parameters
from pipeline.recipe import PruneConfig
from pipeline.stages.base import STAGES, Stage, StageResult
from pipeline.scores import assess, recorded_scores
from pipeline.train import evaluate, fit, recalibrate_if_needed


def _torch_pruning():
    return require("torch_pruning", "Torch-Pruning", "pip install torch-pruning==1.6.1")


def make_pruner(model: torch.nn.Module, arch: str, cfg: PruneConfig, plan: dict, input_shape):
    """A DepGraph MetaPruner for ``plan`` that never touches the classifier.

    A plan prunes every layer at channel ratio ``ratio`` except the first ``dense_layers``
    convolutions, which get ``dense_ratio``. Rounding to multiples of 8 makes the MACs of a
    uniform ratio jump in steps (ResNet-50 at 32×32: 21.8% → 25.9% between ratios 0.500 and
    0.495), so mixing two neighbouring ratios layer by layer is what reaches a target within 5%.
    """
    tp = _torch_pruning()
    classifier = model.get_submodule(ARCHITECTURES.get(arch).classifier)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    per_layer = {conv: plan["dense_ratio"] for conv in convs[: plan.get("dense_layers", 0)]}
    return tp.pruner.MetaPruner(
        model,
        torch.zeros(input_shape),
        importance=tp.importance.MagnitudeImportance(p=1 if cfg.importance == "l1" else 2),
        pruning_ratio=plan["ratio"],
        pruning_ratio_dict=per_layer or None,
        iterative_steps=cfg.steps,
        ignored_layers=[classifier],
        round_to=cfg.round_to,
    )


def macs_after(model: torch.nn.Module, arch: str, cfg: PruneConfig, plan: dict, input_shape) -> int:
    """MACs of a copy of ``model`` pruned (all steps at once) according to ``plan``."""
    trial = copy.deepcopy(model).eval()
    pruner = make_pruner(trial, arch, cfg, plan, input_shape)
    for _ in range(cfg.steps):
        pruner.step()
    return count_macs(trial, input_shape)


def _bisect(evaluate, low, high, target: float, good_enough: float, iterations: int, integer: bool = False):
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
        return macs_after(model, arch, cfg, {"ratio": ratio, "dense_ratio": ratio}, input_shape) / base_macs

    tried = _bisect(uniform, 0.0, 0.98, target, good_enough, iterations=14)
    ratio, fraction = min(tried, key=lambda kv: abs(kv[1] - target))
    best = ({"ratio": ratio, "dense_ratio": ratio, "dense_layers": 0}, fraction)
    if abs(fraction - target) <= good_enough:
        return best
    above = max((kv for kv in tried if kv[1] > target), key=lambda kv: kv[0], default=(0.0, 1.0))
    below = min((kv for kv in tried if kv[1] < target), key=lambda kv: kv[0], default=None)
    if below is None:
        return best
    convs = sum(1 for m in model.modules() if isinstance(m, torch.nn.Conv2d))

    def mixed(dense_layers: int) -> float:
        plan = {"ratio": above[0], "dense_ratio": below[0], "dense_layers": dense_layers}
        return macs_after(model, arch, cfg, plan, input_shape) / base_macs

    for dense_layers, value in _bisect(mixed, 0, convs, target, good_enough, iterations=10, integer=True):
        if abs(value - target) < abs(best[1] - target):
            best = ({"ratio": above[0], "dense_ratio": below[0], "dense_layers": int(dense_layers)}, value)
    return best


class PruneStage(Stage):
    name = "prune"

    def needs(self, ctx):
        return ("data", "teacher")

    def config(self, ctx):
        return {"prune": ctx.recipe.section("prune"), "preprocess": ctx.preprocess.to_dict()}

    def run(self, ctx, workdir: Path) -> StageResult:
        cfg = ctx.recipe.prune
        model, info = load_checkpoint(ctx.manifest.output("teacher", "model"))
        arch, input_shape = info["arch"], ctx.preprocess.input_shape(1)
        base_macs, base_params = count_macs(model, input_shape), count_parameters(model)
        plan, predicted = find_plan(model, arch, cfg, input_shape, base_macs)
        print(f"prune: channel ratio {plan['ratio']:.5f} ({plan['dense_ratio']:.5f} on the first "
              f"{plan['dense_layers']} convolutions) → {100 * predicted:.1f}% of the teacher's MACs "
              f"(target {100 * cfg.macs_target:.1f}%)", file=sys.stderr)
        pruner = make_pruner(model, arch, cfg, plan, input_shape)
        test = ctx.batches("test", ctx.recipe.evaluate.batch_size)
        history = []
        for step in range(cfg.steps):
            pruner.step()
            if cfg.finetune and cfg.finetune.epochs:
                train = ctx.batches("train", cfg.finetune.batch_size, shuffle=True, augment=cfg.finetune.augment,
                                    seed=cfg.finetune.seed + step, drop_last=True)

                def loss_fn(logits, batch):
                    return F.cross_entropy(logits, batch.labels, label_smoothing=cfg.finetune.label_smoothing)

                history += fit(model, train, cfg.finetune, loss_fn, ctx.device, f"prune step {step + 1}/{cfg.steps}")
                recalibrate_if_needed(model, cfg.finetune, lambda: ctx.batches("train", 256, shuffle=True,
                                                                               seed=cfg.finetune.seed),
                                      ctx.device, "pruned")
                model.cpu()
        macs = count_macs(model, input_shape)
        fraction = macs / base_macs
        if abs(fraction - cfg.macs_target) > cfg.tolerance * cfg.macs_target:
            raise StageError(
                f"pruned model has {100 * fraction:.1f}% of the teacher's MACs; target {100 * cfg.macs_target:.1f}% "
                f"± {100 * cfg.tolerance:.0f}% (relative)",
                fix="raise prune.tolerance, lower prune.round_to, or choose a reachable macs_target",
            )
        odd = _channels_off_multiple(model, arch, cfg.round_to)
        if odd:
            print(f"prune: note: {len(odd)} layers keep channel counts that are not multiples of {cfg.round_to} "
                  f"(unpruned originals): {odd[:3]}", file=sys.stderr)
        metrics = evaluate(model, test, ctx.device, "pruned eval")
        model.cpu()
        path = save_checkpoint(workdir / "model.pt", model, arch, info["num_classes"], pruned_from="teacher",
                               plan=plan)
        return StageResult(
            outputs={"model": path},
            # Not gated: a pruned model before distillation is expected to be bad; the verdict is recorded.
            metrics={**recorded_scores(metrics), "sanity": assess(metrics, ctx.dataset().classes), "plan": plan,
                     "macs_g": macs / 1e9, "params_m": count_parameters(model) / 1e6,
                     "macs_fraction": fraction, "params_fraction": count_parameters(model) / base_params,
                     "layers_off_multiple": len(odd), "history": history},
        )

    def summary(self, metrics):
        return (f"{100 * metrics['macs_fraction']:.1f}% of the teacher's MACs ({metrics['macs_g']:.3f} G), "
                f"{metrics['params_m']:.2f} M params, top-1 before distillation {100 * metrics['top1']:.2f}%")


def _channels_off_multiple(model: torch.nn.Module, arch: str, multiple: int) -> list[str]:
    classifier = ARCHITECTURES.get(arch).classifier
    odd = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Conv2d) and module.out_channels % multiple:
            odd.append(f"{name}={module.out_channels}")
        elif isinstance(module, torch.nn.Linear) and name != classifier and module.out_features % multiple:
            odd.append(f"{name}={module.out_features}")
    return odd


STAGES.add("prune", PruneStage())

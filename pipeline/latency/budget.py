"""The latency budget: table, knapsack and a search by measurement (:func:`plan_to_budget`), the table's
error on plans it was not fitted to (:func:`check_table`), and the prune stage's latency path
(:func:`latency_plan`).

The prune stage loads this module by name, only for a latency budget (``pipeline.tasks.classification.pruned``'s
``LATENCY_PATH``): a MACs target's code hash does not cover the agent, the runners or the deploy code.
"""

from __future__ import annotations

import copy
import functools
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
from torch import nn

from device.errors import ConfigError, StageError
from device.files import write_json_atomic
from pipeline.prune.channels import at_widths, group_importance, prunable_groups, widths_of
from pipeline.latency.measure import Meter
from pipeline.latency.model import TABLE_FORMAT, LatencyTable, Measurement, build_table, restricted, table_cost
from pipeline.latency.search import nested_path, next_on_path, solve_plan


def _macs(model: nn.Module, arch: str, input_shape, widths: dict[str, int]) -> int:
    from pipeline.models import count_macs

    return count_macs(at_widths(model, arch, input_shape, widths), input_shape)


def plan_to_budget(model: nn.Module, arch: str, cfg, input_shape, meter: Meter,
                   log: Callable[[str], None], batches: Callable[[], Any] | None = None,
                   reference: nn.Module | None = None) -> dict[str, Any]:
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

    **A reference network** (``prune.latency.reference``: another student, a benchmark's arm A) makes the
    budget ``ratio`` × *its* latency, measured afresh beside the table's context and again beside every
    round's plan (never from the cache): each plan is judged by its ratio to the reference in its own
    session, expressed in the table session's milliseconds, so a drift of the device between rounds does not
    move the budget.

    Args:
        model: The unpruned model (not changed).
        cfg: The recipe's :class:`pipeline.core.recipe.PruneConfig` (``latency`` set).
        reference: The reference network (``ratio`` is then of its latency).

    Returns:
        ``widths``, ``budget_ms``, ``unpruned``/``predicted``/``measured`` latencies, ``rounds`` (each with its
        plan, its position on the nested path, prediction and measurement), ``tables`` (the measured
        table, JSON), ``table`` (the one the plans were chosen from, ``max_pruning_ratio`` applied) and
        ``plans`` (every measured plan's MACs and latency, for the report's plot), ``cost`` (what the search
        was estimated to build and take) and ``holdout`` (plans measured after the search and never fitted:
        predicted against measured, the table's error out of sample).

    Raises:
        ConfigError: When the search would build more networks than ``prune.latency.max_networks``.
        StageError: When the budget is below the narrowest plan, or every measured plan missed it.
    """
    target = cfg.latency
    groups = prunable_groups(model, arch, input_shape, cfg.round_to)
    full = {g.name: g.full for g in groups}
    runtime = getattr(getattr(meter, "spec", None), "runtime", "onnxruntime")
    cost = table_cost(groups, full, target, runtime)
    log(f"[   prune] latency: the search builds at most {cost['networks']} {cost['unit']} ({cost['table_networks']} "
        f"for the table) and runs {cost['jobs']} jobs: about {cost['estimate_s'] / 60:.0f} min on the device "
        f"(an estimate; cached measurements are not rebuilt)")
    if cost["networks"] > target.max_networks:
        raise ConfigError(
            f"prune: the latency search would build {cost['networks']} {cost['unit']} (about "
            f"{cost['estimate_s'] / 3600:.1f} h), over prune.latency.max_networks = {target.max_networks}",
            fix="raise prune.latency.max_networks if that is acceptable, or lower prune.latency.widths_per_group, "
                "raise prune.round_to (fewer groups' widths), or lower prune.latency.rounds/holdout")
    importance = group_importance(model, arch, input_shape, cfg.importance,
                                  batches() if cfg.importance == "taylor" and batches is not None else None)
    base_macs = _macs(model, arch, input_shape, full)
    log(f"[   prune] latency: {len(groups)} channel groups; measuring the table around the unpruned network")
    # The unpruned network is the table's context, measured in the table's own session: the budget's
    # reference and the table's changes share one moment of the device.
    measured_table = build_table(model, arch, input_shape, groups, full, meter, target.widths_per_group,
                                 target.kernel_multiple or cfg.round_to,
                                 also={"reference": reference} if reference is not None else None)
    # The plans choose among the candidates max_pruning_ratio allows; the table measures all of them (its
    # cache is shared by every bound).
    table = restricted(measured_table, target.max_pruning_ratio)
    unpruned = table.context_ms
    reference_ms = measured_table.also_ms["reference"].p50_ms if reference is not None else None
    budget = target.ms if target.ms is not None else target.ratio * (reference_ms or unpruned.p50_ms)
    log(f"[   prune] latency: unpruned {unpruned.p50_ms:.3f} ms (windows {min(unpruned.windows_ms):.3f}–"
        f"{max(unpruned.windows_ms):.3f}); budget {budget:.3f} ms"
        + (f" ({target.ratio:g} × the reference's {reference_ms:.3f} ms, measured beside it)" if reference_ms else ""))

    def timed(widths: dict[str, int]) -> tuple[Measurement, float | None]:
        """A plan's measurement, with a reference in the table session's ms (and the reference's own time)."""
        plan = at_widths(model, arch, input_shape, widths)
        if reference is None:
            return meter.measure({"plan": plan})["plan"], None
        got = meter.measure({"plan": plan, "reference": reference}, fresh=["plan", "reference"])
        scale = reference_ms / got["reference"].p50_ms
        m = got["plan"]
        return Measurement(m.p50_ms * scale, (m.ci_ms[0] * scale, m.ci_ms[1] * scale),
                           [w * scale for w in m.windows_ms]), got["reference"].p50_ms
    rounds, plans = [], [{"plan": "unpruned", "macs_fraction": 1.0, "measured_ms": unpruned.to_json()}]
    narrowest_widths = {g.name: g.candidates[0] for g in table.groups}
    narrowest = table.predict(narrowest_widths)
    if budget < narrowest:  # the prediction is extrapolated this far out: measured before refusing
        narrowest = timed(narrowest_widths)[0].p50_ms
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
        measured, reference_now = timed(widths)
        macs_fraction = _macs(model, arch, input_shape, widths) / base_macs
        rounds.append({"round": index + 1, "path_position": position, "path_length": len(path) if path else None,
                       "widths": widths, "predicted_ms": predicted, "additive_ms": table.additive(widths),
                       "measured_ms": measured.to_json(), "macs_fraction": macs_fraction,
                       **({"reference_ms": reference_now} if reference is not None else {})})
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
    if unpruned.p50_ms <= budget * (1 + target.tolerance) and all(r["widths"] != full for r in rounds):
        # The unpruned network meets the budget (a budget of another network's latency can): it is the widest
        # plan, measured in the table's session, and a candidate like the rounds.
        rounds.append({"round": len(rounds) + 1, "path_position": 0, "path_length": len(path) if path else None,
                       "widths": dict(full), "predicted_ms": table.predict(full), "additive_ms": table.additive(full),
                       "measured_ms": unpruned.to_json(), "macs_fraction": 1.0, "unpruned": True})
        plans.append({"plan": f"round {len(rounds)} (unpruned)", "macs_fraction": 1.0,
                      "predicted_ms": table.predict(full), "measured_ms": unpruned.to_json()})
        log(f"[   prune] latency: the unpruned network measured {unpruned.p50_ms:.3f} ms, within the budget of "
            f"{budget:.3f} ms: it is a candidate plan")
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
    holdout = measure_holdout(model, arch, input_shape, meter, table, importance, budget, rounds, base_macs,
                              target.holdout, log)
    return {"widths": chosen["widths"], "budget_ms": budget, "cost": cost, "holdout": holdout,
            "reference_ms": reference_ms, "unpruned_ms": unpruned.to_json(),
            "predicted_ms": chosen["predicted_ms"], "measured_ms": chosen["measured_ms"],
            "macs_fraction": chosen["macs_fraction"], "chosen_round": chosen["round"],
            "rounds": rounds, "tables": [measured_table.to_json()], "table": table, "groups": groups,
            "plans": plans, "sweep": sweep, "base_macs": base_macs, "importance": importance}


def measure_holdout(model: nn.Module, arch: str, input_shape, meter, table: LatencyTable,
                    importance: dict[str, Any], budget_ms: float, rounds: list[dict[str, Any]], base_macs: int,
                    count: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The table's error out of sample: ``count`` plans it was never fitted to, predicted, then measured.

    The knapsack's plans for budgets around this one (from 0.7× to 1.4×: the plans a neighbouring budget
    would ship), skipping those already measured as rounds; they are measured in one interleaved call and
    never added to the fit. A round's prediction is out of sample too (made before it was measured), but
    the rounds walk towards the budget and every one of them refined the fit the next was predicted by.
    """
    if count <= 0:
        return []
    seen = [r["widths"] for r in rounds]
    plans: dict[str, dict[str, int]] = {}
    for factor in np.linspace(0.7, 1.4, max(count * 2, 4)):
        option = solve_plan(table, importance, budget_ms * factor)
        if option is not None and option not in seen:
            seen.append(option)
            plans[f"held out {len(plans) + 1} ({factor:.2f}× budget)"] = option
        if len(plans) == count:
            break
    if not plans:
        return []
    predicted = {name: table.predict(widths) for name, widths in plans.items()}  # before measuring: honest
    measured = meter.measure({name: functools.partial(at_widths, model, arch, input_shape, widths)
                              for name, widths in plans.items()})
    out = []
    for name, widths in plans.items():
        m = measured[name]
        out.append({"plan": name, "widths": widths, "predicted_ms": predicted[name], "measured_ms": m.to_json(),
                    "error": (predicted[name] - m.p50_ms) / m.p50_ms,
                    "macs_fraction": _macs(model, arch, input_shape, widths) / base_macs})
    log("[   prune] latency table out of sample: " + "; ".join(
        f"{h['plan']} predicted {h['predicted_ms']:.3f} ms, measured {h['measured_ms']['p50_ms']:.3f} ms "
        f"({100 * h['error']:+.1f}%)" for h in out))
    return out


def check_table(model: nn.Module, arch: str, cfg, input_shape, meter: Meter, search: dict[str, Any],
                log: Callable[[str], None]) -> dict[str, Any]:
    """Predicted against measured latency of the unpruned and of a MACs-pruned network (the table's error).

    The MACs-pruned network is the MACs path's own plan (:func:`pipeline.prune.ratio.find_plan`) at
    ``check_macs_target``, by default the chosen plan's MACs fraction (half the MACs when the plan kept
    almost everything).
    """
    from pipeline.prune.ratio import find_plan, make_pruner

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
        # The unpruned network and the chosen plan were fitted (in sample); the MACs-pruned one never was.
        checks[label] = {"predicted_ms": predicted, "measured_ms": value.to_json(),
                         "error": (predicted - value.p50_ms) / value.p50_ms, "in_fit": label != "macs_pruned"}
    checks["macs_pruned"].update(macs_fraction=achieved, plan=macs_plan)
    log("[   prune] latency table check: " + "; ".join(
        f"{k} predicted {v['predicted_ms']:.3f} ms, measured {v['measured_ms']['p50_ms']:.3f} ms "
        f"({100 * v['error']:+.1f}%)" for k, v in checks.items()))
    return checks



def latency_plan(ctx, workdir: Path, model: nn.Module, arch: str, cfg, input_shape, train_batches):
    """The prune stage's latency path: table, knapsack and measured plan on the budget's device.

    Args:
        ctx: The run's :class:`pipeline.core.context.RunContext`.
        workdir: The stage's folder (the table's JSON is written there; the exported sub-networks are
            scratch, removed whether the budget was met or refused).
        train_batches: A callable returning training batches (Taylor importance).

    Returns:
        (the widths, the budget in ms, the groups, the ``latency`` metrics: budget, the student's predicted
        and measured latency, the rounds, the table check, the held-out plans and the plots' data).
    """
    from pipeline.latency import measure

    target = cfg.latency
    try:
        with measure.open_agent(ctx.devices, target.device, ctx.log) as (client, info, identity):
            spec = measure.device_spec(info, ctx.recipe.deploy, target, ctx.recipe.preprocess.to_preprocess().to_dict(),
                                       f"{ctx.recipe.name}/{ctx.run_dir.name}/latency-table")
            meter = Meter(client, spec, identity, ctx.run_dir.parent / "latency-cache", workdir / "latency-onnx",
                          target.windows, ctx.recipe.export.opset, input_shape, log=ctx.log)
            reference = None
            if target.reference:
                from pipeline.checkpoint import load_checkpoint

                from pipeline.models import as_exported

                reference, info = load_checkpoint(target.reference)
                reference = as_exported(reference.eval(), info["arch"], info["folded"])[0]  # timed as exported
            search = plan_to_budget(model, arch, cfg, input_shape, meter, ctx.log, batches=train_batches,
                                    reference=reference)
            checks = check_table(model, arch, cfg, input_shape, meter, search, ctx.log) if target.check else None
    finally:
        # The exported sub-networks are scratch (the table and the cache keep their times), refused budget
        # or not: a float ResNet-50 table left gigabytes in .prune.partial/.
        shutil.rmtree(workdir / "latency-onnx", ignore_errors=True)
    plans = search["plans"] + ([{"plan": f"MACs target {100 * checks['macs_pruned']['macs_fraction']:.1f}%",
                                  "macs_fraction": checks["macs_pruned"]["macs_fraction"],
                                  "predicted_ms": checks["macs_pruned"]["predicted_ms"],
                                  "measured_ms": checks["macs_pruned"]["measured_ms"]}] if checks else [])
    write_json_atomic(workdir / "latency_table.json",
                      {"format": TABLE_FORMAT, "device": identity, "spec": spec.model_dump(mode="json", exclude={"artifact"}),
                       "tables": search["tables"], "rounds": search["rounds"], "check": checks,
                       "holdout": search["holdout"]})
    measured = search["measured_ms"]["p50_ms"]
    metrics = {"device": target.device, "agent": identity.get("agent"), "budget_ms": search["budget_ms"],
               "unpruned_ms": search["unpruned_ms"], "predicted_ms": search["predicted_ms"],
               "measured_ms": search["measured_ms"], "prediction_error": (search["predicted_ms"] - measured) / measured,
               "rounds": len(search["rounds"]), "jobs": meter.jobs, "reused": meter.reused, "check": checks,
               "plans": plans, "sweep": search["sweep"], "table": "prune/latency_table.json",
               "reference_ms": search["reference_ms"], "cost": search["cost"], "holdout": [{k: v for k, v in h.items() if k != "widths"}
                                                   for h in search["holdout"]]}
    return search["widths"], search["budget_ms"], search["groups"], metrics

"""The latency-budget pruner: knapsack, table, recipe and the tiny recipe end to end on a loopback agent.

No timing asserts: the measured numbers are checked for consistency (the plan meets the budget the stage
itself measured, within its tolerance), never against fixed times; speed lives in bench/latency_prune.py.
"""

import copy
import json
import math
import random
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from device.errors import ConfigError, StageError
from pipeline.prune import channels, knapsack
from pipeline.tasks.classification import report
from pipeline.latency import budget as lbudget
from pipeline.latency import measure
from pipeline.latency import search as lsearch
from pipeline.latency import model as lmodel
from pipeline.checkpoint import load_checkpoint
from pipeline.deploy.devices import Device
from pipeline.models import build_model
from pipeline.core.recipe import PruneConfig, parse_recipe
from tests.slow import slow_fixture

REPO = Path(__file__).resolve().parents[2]
SHAPE = (1, 3, 16, 16)


# ------------------------------------------------------------------------------------------------ knapsack
def test_knapsack_finds_the_known_optimum():
    # Three groups of two widths each. The greedy by importance-per-ms takes group 0 first (7/6 > 5/5) and is
    # then left 4 ms, too little for either other group: value 7. The optimum keeps groups 1 and 2: value 10.
    values = [[0, 7], [0, 5], [0, 5]]
    costs = [[0, 6], [0, 5], [0, 5]]
    assert knapsack.solve(values, costs, 10) == [0, 1, 1]
    assert knapsack.brute_force(values, costs, 10) == (10, [0, 1, 1])
    # The same choice when costs are changes against a context (negative) and the budget is shifted alike.
    assert knapsack.solve(values, [[c - 6 for c in g] for g in costs], 10 - 18) == [0, 1, 1]


def test_knapsack_matches_brute_force_on_random_cases():
    rng = random.Random(0)
    for _ in range(200):
        groups = rng.randint(1, 4)
        values = [sorted(rng.uniform(0, 10) for _ in range(rng.randint(1, 4))) for _ in range(groups)]
        # Negative costs too: the table holds changes against a context plan.
        costs = [sorted(rng.uniform(-3, 5) for _ in v) for v in values]
        budget = rng.uniform(-2, 8)
        picked = knapsack.solve(values, costs, budget, resolution=20000)
        best = knapsack.brute_force(values, costs, budget)
        if best is None:
            assert picked is None
            continue
        assert picked is not None
        assert sum(costs[g][o] for g, o in enumerate(picked)) <= budget + 1e-9, "never over the budget"
        # Exact up to the rounding of costs to 1/20000 of the budget's slack.
        assert sum(values[g][o] for g, o in enumerate(picked)) >= best[0] - 0.3


def test_knapsack_says_when_the_budget_is_unreachable():
    assert knapsack.solve([[1, 2]], [[1.0, 2.0]], 0.5) is None




# ------------------------------------------------------------------------------------------------ results
def test_latency_ms_reads_a_batch_and_gives_an_interval():
    from device.errors import SchemaVersionError
    from tests.results import job_result, run

    one, eight = run(1, p50_ms=2.0), run(8, p50_ms=9.0)
    eight["latency_std_ms"] = 0.0
    result = job_result(runs=[one, eight])
    p50, low, high = measure.latency_ms(result, 1)
    assert p50 == 2.0 and low < 2.0 < high
    assert measure.latency_ms(result, 8) == (9.0, 9.0, 9.0)
    with pytest.raises(StageError):
        measure.latency_ms(result, 4)
    with pytest.raises(SchemaVersionError):
        measure.latency_ms({**result, "schema": "edgefold.result/1"}, 1)


# ------------------------------------------------------------------------------------------------ recipe
def _tiny_raw():
    return yaml.safe_load((REPO / "models" / "tiny.yaml").read_text())


def test_recipe_takes_exactly_one_target():
    raw = _tiny_raw()
    raw["prune"]["latency"] = {"device": "edge", "ratio": 0.5}
    with pytest.raises(ConfigError, match="exactly one target"):
        parse_recipe(raw)
    assert parse_recipe(_tiny_raw()).prune.importance == "l2", "auto: magnitude for a MACs target"
    del raw["prune"]["macs_target"]
    assert parse_recipe(raw).prune.latency.ratio == 0.5
    assert parse_recipe(raw).prune.importance == "taylor", "auto: values a knapsack can compare across groups"
    raw["prune"]["latency"]["ms"] = 1.2
    with pytest.raises(ConfigError, match="exactly one of ratio"):
        parse_recipe(raw)
    raw["prune"]["latency"] = {"device": "edge", "ratio": 0.5, "windws": 3}
    with pytest.raises(ConfigError, match="windws: unknown key"):
        parse_recipe(raw)


def test_the_renamed_points_key_is_refused_naming_widths_per_group():
    raw = _tiny_raw()
    del raw["prune"]["macs_target"]
    raw["prune"]["latency"] = {"device": "edge", "ratio": 0.5, "points": 3}
    with pytest.raises(ConfigError, match="prune.latency: 'points' was renamed 'widths_per_group'"):
        parse_recipe(raw)
    raw["prune"]["latency"] = {"device": "edge", "ratio": 0.5, "widths_per_group": 3}
    assert parse_recipe(raw).prune.latency.widths_per_group == 3


# ------------------------------------------------------------------------------------------------ groups
def test_groups_widths_and_importance_on_the_tiny_net():
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    assert {g.name for g in groups} >= {"stem.0", "layers.0.conv1", "layers.2.conv1"}
    assert all(c % 4 == 0 for g in groups for c in g.candidates) and all(g.candidates[-1] == g.full for g in groups)
    assert "fc" not in {g.name for g in groups}, "the classifier is never a group"
    widths = {g.name: g.candidates[len(g.candidates) // 2 - 1] for g in groups}
    pruned = channels.at_widths(model, "tiny_resnet", SHAPE, widths)
    assert channels.widths_of(pruned, groups) == widths
    assert pruned.fc.out_features == 10 and pruned(torch.zeros(2, 3, 16, 16)).shape == (2, 10)
    assert channels.widths_of(model, groups) == {g.name: g.full for g in groups}, "the original is untouched"

    # Importance: the channels kept are the group's most important ones (a planted strong filter survives).
    with torch.no_grad():
        model.layers[0].conv1.weight[13].mul_(100.0)
    channels.set_widths(model, "tiny_resnet", SHAPE, {"layers.0.conv1": 4}, importance="l2")
    assert model.layers[0].conv1.out_channels == 4
    assert model.layers[0].conv1.weight.abs().sum(dim=(1, 2, 3)).max() > 10 * 0.5


def test_tables_time_the_deployed_precision_unless_told_float(tmp_path):
    """The deployed rung is INT8 Q/DQ: the table's networks are quantized for timing and sent as int8 jobs;
    ``precision: float`` times the float student instead."""
    import onnx
    import onnxruntime as ort

    from pipeline.core.recipe import LatencyTarget, parse_recipe
    from pipeline.export.onnx import export_onnx

    recipe = parse_recipe(_tiny_raw())
    info = {"tensorrt": None, "runtimes": ["onnxruntime"]}
    preprocess = {"input_size": 16, "resize": 16, "channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3}
    deployed = measure.device_spec(info, recipe.deploy, LatencyTarget(ratio=0.5), preprocess, "t")
    floating = measure.device_spec(info, recipe.deploy, LatencyTarget(ratio=0.5, precision="float"), preprocess, "t")
    assert (deployed.precision, floating.precision) == ("int8", "fp32")
    assert deployed.batch_sizes == [1] and deployed.idle_s == 0

    model = build_model("tiny_resnet", 10).eval()
    fp32, int8 = tmp_path / "m.onnx", tmp_path / "m.int8.onnx"
    export_onnx(model, fp32, SHAPE, 17)
    measure.quantize_for_timing(fp32, int8, SHAPE)
    ops = {node.op_type for node in onnx.load(str(int8)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    session = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: np.zeros(SHAPE, np.float32)})[0]
    assert out.shape == (1, 10)


def test_step_widths_walk_evenly_to_the_plan():
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    final = {g.name: g.candidates[0] for g in groups}
    steps = [channels.step_widths(groups, final, s, 3, 4) for s in (1, 2, 3)]
    assert steps[-1] == final
    for g in groups:
        seq = [g.full] + [s[g.name] for s in steps]
        assert seq == sorted(seq, reverse=True) and all(w % 4 == 0 for w in seq)


# ------------------------------------------------------------------------------------------------ agents
def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_agent_says_how_to_fix_it(tmp_path):
    token = tmp_path / "token"
    token.write_text("x\n")
    device = Device("edge", "edge", f"http://127.0.0.1:{_closed_port()}", "edge", str(token))
    with pytest.raises(StageError) as err:
        with measure.open_agent([device], "edge", lambda m: None):
            pass
    assert "unreachable" in err.value.message and "EDGE=/DC=/DEVICES=" in err.value.fix
    assert "loopback" in err.value.fix


def test_a_budget_on_an_unknown_device_is_refused(tmp_path):
    device = Device("orin", "edge", "http://127.0.0.1:1", "orin")
    with pytest.raises(ConfigError, match="'jetson' is none of the configured devices"):
        with measure.open_agent([device], "jetson", lambda m: None):
            pass


# ------------------------------------------------------------------------------------------------ end to end
def _latency_recipe(tmp_path, **latency_cfg) -> Path:
    raw = _tiny_raw()
    raw["teacher"]["train"]["epochs"] = 2
    raw["prune"] = {"round_to": 4, "steps": 2, "latency": {
        "device": "edge", "ratio": 0.9, "windows": 2, "widths_per_group": 3, "duration_s": 0.1, "tolerance": 0.1,
        "rounds": 5, **latency_cfg}}  # 5: a loaded host can need more than 3 to land
    raw["deploy"]["threads"] = 1
    path = tmp_path / "tiny_latency.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
@slow_fixture
def latency_teacher(tmp_path_factory) -> Path:
    """The latency recipe's data and teacher stages, run once: each test prunes a copy its own way (the stages'
    config and inputs are unchanged, so the manifest skips them)."""
    from pipeline.runner import run_pipeline

    root = tmp_path_factory.mktemp("latency-teacher")
    return run_pipeline(str(_latency_recipe(root)), until="teacher", runs_dir=root / "runs", run_id="a").run_dir


def _copy_of(teacher_run: Path, runs: Path, run_id: str) -> Path:
    shutil.copytree(teacher_run, runs / teacher_run.parent.name / run_id)
    return runs


def test_tiny_recipe_prunes_to_a_latency_budget_on_the_loopback_agent(latency_teacher, tmp_path, capsys):
    from pipeline.runner import run_pipeline

    # 0.8: the narrowest plan of this net is ORT's per-call floor, 0.66-0.76x of the unpruned time by CPU and
    # load (0.76x on a loaded AMD EPYC, where 0.75 was refused as below it). 15%: the unpruned net (1.25x) stays
    # outside the tolerance, and a bracket refused at 3x it (45%) spans the 33% steps a busy host shows.
    recipe = _latency_recipe(tmp_path, ratio=0.8, tolerance=0.15)
    runs = _copy_of(latency_teacher, tmp_path / "runs", "a")
    ctx = run_pipeline(str(recipe), until="prune", runs_dir=runs, run_id="a")
    assert "[ teacher] cached" in capsys.readouterr().err
    stage = ctx.manifest.stage("prune")
    lat = stage["metrics"]["latency"]
    budget, measured = lat["budget_ms"], lat["measured_ms"]["p50_ms"]
    assert budget == pytest.approx(0.8 * lat["unpruned_ms"]["p50_ms"])
    assert measured <= budget * 1.15, "the pruned plan meets the budget the stage measured, within its tolerance"
    # Not a timing assert (a loaded host can invert two close times): the chosen plan is a real cut.
    assert lat["jobs"] > 0 and next(p for p in lat["plans"] if p.get("chosen"))["macs_fraction"] < 1.0
    for name in ("unpruned", "macs_pruned", "plan"):
        check = lat["check"][name]
        assert check["error"] == pytest.approx((check["predicted_ms"] - check["measured_ms"]["p50_ms"])
                                               / check["measured_ms"]["p50_ms"])
    assert sum(1 for p in lat["plans"] if p.get("chosen")) == 1
    # Out of sample: held-out plans, predicted then measured, never fitted; the cost was said before measuring.
    assert lat["holdout"] and all(h["error"] == pytest.approx((h["predicted_ms"] - h["measured_ms"]["p50_ms"])
                                                              / h["measured_ms"]["p50_ms"]) for h in lat["holdout"])
    assert lat["check"]["macs_pruned"]["in_fit"] is False and lat["check"]["plan"]["in_fit"] is True
    assert lat["cost"]["jobs"] >= lat["jobs"] and lat["cost"]["unit"] == "onnxruntime sessions"
    assert not list((ctx.run_dir / "prune").glob("*.png")), "the stage records data; the report draws the plots"
    table = json.loads((ctx.run_dir / "prune" / "latency_table.json").read_text())
    assert table["format"] == lmodel.TABLE_FORMAT and table["device"]["agent"] == "loopback"
    assert table["spec"]["batch_sizes"] == [1] and table["spec"]["threads"] == 1
    assert table["spec"]["precision"] == "int8", "timed in the deployed rung's precision by default"
    assert table["spec"]["runtime"] == "onnxruntime"

    # The checkpoint holds exactly the plan's widths, on round_to, classifier whole; it reloads.
    model, _ = load_checkpoint(ctx.run_dir / "prune" / "model.pt")
    groups = channels.prunable_groups(build_model("tiny_resnet", 10), "tiny_resnet", SHAPE, 4)
    got = channels.widths_of(model, groups)
    chosen = next(p["plan"] for p in lat["plans"] if p.get("chosen"))  # not always the last round on a busy host
    assert got == table["rounds"][int(chosen.split()[-1]) - 1]["widths"] == stage["metrics"]["plan"]["widths"]
    assert all(w % 4 == 0 for w in got.values()) and model.fc.out_features == 10
    assert got != {g.name: g.full for g in groups}, "something was pruned"

    from pipeline.report.sections import to_html_fragment, to_markdown_lines

    # The report's section says why: the plans' MACs against measured latency, predicted against measured.
    out = tmp_path / "report"
    out.mkdir()
    sections = report.latency_section(ctx.manifest.data, ctx.run_dir, out)
    section = "\n".join(to_markdown_lines(sections[0]))
    assert "## Pruned to a latency budget" in section and "(chosen)" in section and "unpruned" in section
    assert f"{measured:.4f}" in section and (out / "latency_plans.png").stat().st_size > 1000
    assert "![MACs against measured latency of the candidate plans" in section, "report.md shows the copied plot"
    page = to_html_fragment(sections[0])
    assert "<h2>Pruned to a latency budget</h2>" in page and "(chosen)" in page and f"{measured:.4f}" in page
    assert "data:image/png;base64," in page, "the plot is embedded: report.html is one file"
    assert report.latency_section({"stages": {"prune": {"metrics": {}}}}, ctx.run_dir, out) == []

    # A second run on the same device and structures measures nothing again: the table is cached.
    ctx2 = run_pipeline(str(recipe), until="prune", runs_dir=_copy_of(latency_teacher, runs, "b"), run_id="b")
    lat2 = ctx2.manifest.stage("prune")["metrics"]["latency"]
    assert lat2["jobs"] == 0 and lat2["reused"] > 0
    assert np.isclose(lat2["budget_ms"], budget)


def test_an_unreachable_budget_is_refused_with_a_fix(latency_teacher, tmp_path):
    from pipeline.runner import run_pipeline

    # The fewest measurements that still export and time every group's sub-networks (2 widths, 1 window).
    recipe = _latency_recipe(tmp_path, ratio=0.01, check=False, rounds=1, widths_per_group=2, windows=1)
    with pytest.raises(StageError) as err:
        run_pipeline(str(recipe), until="prune", runs_dir=_copy_of(latency_teacher, tmp_path / "runs", "a"), run_id="a")
    assert "below the narrowest plan's measured" in err.value.message and "prune.latency.ratio" in err.value.fix
    # The refusal removes the exported sub-networks (a float ResNet-50 table left gigabytes there).
    (staging,) = (tmp_path / "runs").glob("*/a/.prune.partial")
    assert not (staging / "latency-onnx").exists() and not list(staging.rglob("*.onnx"))


def test_layer_model_prices_two_neighbouring_cuts_where_the_additive_table_double_counts():
    # A synthetic device whose time is exactly bilinear in the widths (every layer: a time per MAC) plus a
    # fixed overhead; the fit sees only the table's single-group changes, like the real table.
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    layers = lmodel.LayerModel.of(model, "tiny_resnet", SHAPE, groups)
    assert layers.in_group[layers.names.index("layers.0.conv2")] == "layers.0.conv1"
    assert layers.out_group[layers.names.index("layers.0.conv1")] == "layers.0.conv1"
    assert layers.in_group[layers.names.index("fc")] is not None and layers.out_group[layers.names.index("fc")] is None
    truth = np.concatenate([[0.02, 0.0], np.random.default_rng(0).uniform(0.5, 2.0, len(layers.names))])

    def device(widths):
        return float(layers.features(widths) @ truth)

    full = {g.name: g.full for g in groups}
    samples = [(full, device(full))] + [({**full, g.name: w}, device({**full, g.name: w}))
                                        for g in groups for w in g.candidates[:-1]]
    layers.fit(samples)
    for plan, model_error, additive_error in (({g.name: g.candidates[len(g.candidates) // 2] for g in groups}, 0.02, 0.2),
                                              ({g.name: g.candidates[0] for g in groups}, 0.25, 1.0)):
        additive = device(full) + sum(device({**full, g.name: plan[g.name]}) - device(full) for g in groups)
        assert abs(layers.predict(plan) - device(plan)) < model_error * device(plan)
        assert abs(additive - device(plan)) > additive_error * device(plan), "single-group changes double-count"


def test_taylor_importance_ranks_by_loss_change():
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    batches = [(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))) for _ in range(2)]
    with pytest.raises(ConfigError, match="needs training batches"):
        channels.group_importance(model, "tiny_resnet", SHAPE, "taylor")
    scores = channels.group_importance(model, "tiny_resnet", SHAPE, "taylor", batches)
    assert all(p.grad is None for p in model.parameters()), "gradients cleared"
    assert set(scores) == {g.name for g in channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)}
    assert all(np.all(np.diff(v) <= 0) and np.all(v >= 0) for v in scores.values()), "sorted, non-negative"
    # Not normalized per group: group totals differ (magnitude importance makes each total its width).
    totals = [v.sum() / len(v) for v in scores.values()]
    assert max(totals) > 2 * min(totals)
    # Squared per batch and averaged: one batch's scores are its own (|Σ w·g|)², the mean of two batches'
    # squares is not the square of their summed gradients (which cancel at a trained model).
    one = channels.taylor_scores(model, "tiny_resnet", SHAPE, batches[:1])
    two = channels.taylor_scores(model, "tiny_resnet", SHAPE, batches)
    other = channels.taylor_scores(model, "tiny_resnet", SHAPE, batches[1:])
    for name in one:
        assert torch.allclose(two[name], (one[name] + other[name]) / 2)
    # set_widths keeps the channels the scores rank highest.
    name = next(n for n, v in one.items() if len(v) >= 8)
    width = len(one[name]) // 2
    keep = set(torch.argsort(one[name], descending=True)[:width].tolist())
    pruned = channels.set_widths(copy.deepcopy(model), "tiny_resnet", SHAPE, {name: width}, "taylor", scores=one)
    kept = dict(pruned.named_modules())[name]
    original = dict(model.named_modules())[name]
    assert torch.equal(kept.weight, original.weight[sorted(keep)])


def test_grouped_convolutions_lose_whole_groups_on_the_latency_path():
    """RegNet's grouped convolutions: widths are whole conv-groups (and on round_to), the knapsack's values
    keep a conv-group's channels together, and set_widths keeps the conv-groups the scores rank highest."""
    from pipeline.prune.ratio import grouped_convs

    torch.manual_seed(0)
    shape = (1, 3, 32, 32)
    model = build_model("regnet_y_400mf", 10).eval()
    groups = {g.name: g for g in channels.prunable_groups(model, "regnet_y_400mf", shape, 4)}
    blocked = [g for g in groups.values() if g.block > 1]
    assert blocked, "RegNet's bottlenecks hold grouped convolutions"
    for group in blocked:  # 8-channel conv-groups with round_to 4: multiples of 8
        assert group.block == 8 and all(c % 8 == 0 for c in group.candidates)
    assert any(c % 8 for g in groups.values() if g.block == 1 for c in g.candidates[:-1]), "round_to 4 elsewhere"

    scores = channels.channel_scores(model, "regnet_y_400mf", shape, "l2")
    name = blocked[0].name
    blocks = scores[name].reshape(-1, 8)
    assert torch.allclose(blocks, blocks[:, :1].expand_as(blocks)), "one value per conv-group"
    values = channels.group_importance(model, "regnet_y_400mf", shape, "l2")[name]
    assert np.allclose(values.reshape(-1, 8), values.reshape(-1, 8)[:, :1])

    before = {id(conv): conv.groups for conv in grouped_convs(model)}
    width = blocked[0].candidates[len(blocked[0].candidates) // 2]
    conv_a = dict(model.named_modules())[name]
    kept_blocks = torch.argsort(blocks[:, 0], descending=True)[: width // 8].sort().values
    expected = conv_a.weight.detach().reshape(-1, 8, *conv_a.weight.shape[1:])[kept_blocks].reshape(
        -1, *conv_a.weight.shape[1:]).clone()
    pruned = channels.set_widths(model, "regnet_y_400mf", shape, {name: width}, "l2")
    assert torch.equal(dict(pruned.named_modules())[name].weight, expected), "the top conv-groups are kept"
    changed = [conv for conv in grouped_convs(pruned) if conv.groups != before[id(conv)]]
    assert len(changed) == 1 and changed[0].out_channels == width and changed[0].groups == width // 8
    assert pruned(torch.zeros(shape)).shape == (1, 10)
    with pytest.raises(StageError, match="not whole groups"):
        channels.set_widths(pruned, "regnet_y_400mf", shape, {blocked[1].name: 12}, "l2")


def test_the_plan_fills_the_budget_by_the_full_prediction():
    """On a bilinear device the separable knapsack alone misjudges deep cuts (the iteration swung to a plan
    using 11% of this budget; on ResNet-50 0.6% of the MACs for a 0.77 ms budget); the repaired plan fits
    the budget by the full prediction and no single step up still fits (nothing left on the table)."""
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    layers = lmodel.LayerModel.of(model, "tiny_resnet", SHAPE, groups)
    full = {g.name: g.full for g in groups}
    for seed, fraction in ((12, 0.5), (3, 0.05), (11, 0.2), (5, 0.5), (0, 0.8)):
        layers.coef = np.concatenate([[0.02, 0.0], np.random.default_rng(seed).uniform(0.1, 3.0, len(layers.names))])
        table = lmodel.LatencyTable(full, lmodel.Measurement(layers.predict(full), (0, 0), [0]), groups,
                                     model=layers)
        rng = np.random.default_rng(seed + 100)
        importance = {g.name: np.sort(rng.uniform(0, 1, g.full))[::-1] for g in groups}
        narrowest = table.predict({g.name: g.candidates[0] for g in groups})
        budget = narrowest + fraction * (table.predict(full) - narrowest)
        plan = lsearch.solve_plan(table, importance, budget)
        assert table.predict(plan) <= budget + 1e-9
        for g in groups:
            index = g.candidates.index(plan[g.name])
            if index + 1 < len(g.candidates):
                assert table.predict({**plan, g.name: g.candidates[index + 1]}) > budget, f"{g.name} could grow"
    assert lsearch.solve_plan(table, importance, narrowest * 0.9) is None


def _device(groups, ms_of):
    """A class standing in for the agent's meter (the table only needs times for widths): every network
    measures ``ms_of(its widths)``, exactly."""
    class Device:
        jobs = reused = 0

        def measure(self, models, refresh=(), fresh=()):
            out = {}
            for name, m in models.items():
                ms = ms_of(channels.widths_of(m if isinstance(m, torch.nn.Module) else m(), groups))
                out[name] = lmodel.Measurement(ms, (ms, ms), [ms])
            return out

    return Device


def test_a_tables_measured_dip_is_pooled_so_a_wider_group_never_costs_less():
    """stem.0 measured faster at 12 channels than at 8 (noise): the table's curve pools the two (isotonic
    regression) instead of telling the knapsack that 8 channels cost more than 12."""
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    full = {g.name: g.full for g in groups}
    stem_ms = {4: 0.0, 8: 0.2, 12: 0.1, 16: 0.3}
    Device = _device(groups, lambda widths: 1.0 + stem_ms[widths["stem.0"]])
    table = lmodel.build_table(model, "tiny_resnet", SHAPE, groups, full, Device(), 4)
    assert table.delta_ms["stem.0"] == pytest.approx([-0.3, -0.15, -0.15, 0.0])


def test_a_plan_far_under_the_budget_is_refused_not_shipped():
    """A device on which every pruned plan measures a tenth of its prediction: no round lands near the
    budget, and the stage says so instead of shipping the closest plan under it (a needlessly small model)."""
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    full = {g.name: g.full for g in groups}
    Device = _device(groups, lambda widths: 1.0 if widths == full else
                     0.1 + 0.8 * sum(widths.values()) / sum(full.values()) / 10)
    cfg = PruneConfig(round_to=4, importance="l2", latency={"ratio": 0.6, "widths_per_group": 2, "rounds": 3, "tolerance": 0.05})
    with pytest.raises(StageError, match="no measured plan came near the budget of 0.600 ms") as err:
        lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Device(), lambda m: None)
    assert "rounds" in err.value.fix


def test_the_nested_path_narrows_one_step_at_a_time_through_the_knapsacks_plan():
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    layers = lmodel.LayerModel.of(model, "tiny_resnet", SHAPE, groups)
    layers.coef = np.concatenate([[0.02, 0.0], np.random.default_rng(1).uniform(0.1, 3.0, len(layers.names))])
    full = {g.name: g.full for g in groups}
    table = lmodel.LatencyTable(full, lmodel.Measurement(layers.predict(full), (0, 0), [0]), groups, model=layers)
    importance = {g.name: np.sort(np.random.default_rng(2).uniform(0, 1, g.full))[::-1] for g in groups}
    through = lsearch.solve_plan(table, importance, 0.5 * table.predict(full))
    path = lsearch.nested_path(table, importance, through)
    assert path[0] == full and path[-1] == {g.name: g.candidates[0] for g in groups} and through in path
    assert len(path) == 1 + sum(len(g.candidates) - 1 for g in groups)
    for wider, narrower in zip(path, path[1:]):
        changed = [g for g in groups if narrower[g.name] != wider[g.name]]
        assert len(changed) == 1, "one group, one candidate per step"
        g = changed[0]
        assert g.candidates.index(narrower[g.name]) == g.candidates.index(wider[g.name]) - 1
    assert all(table.predict(a) >= table.predict(b) for a, b in zip(path, path[1:]))


@pytest.mark.parametrize("shape_of_truth", ["convex", "concave", "steps"])
def test_the_search_on_the_path_brackets_and_closes_whatever_the_prediction(shape_of_truth):
    """Measured time falls along the path but the prediction is wrong by a shape, not a scale (ResNet-50:
    predicted 0.83 ms, measured 2.26): interpolation guarded by bisection lands within a few rounds, and
    a budget between two neighbouring plans closes the bracket instead of measuring forever."""
    n = 1400  # about ResNet-50's path at round_to 8
    predicted = list(np.linspace(4.0, 0.1, n))
    truth = {"convex": lambda i: 0.1 + 3.9 * (1 - i / (n - 1)) ** 3,
             "concave": lambda i: 0.1 + 3.9 * (1 - (i / (n - 1)) ** 4),
             "steps": lambda i: 0.1 + 0.6 * ((n - 1 - i) // 200)}[shape_of_truth]
    for budget in (0.3, 0.83, 2.0, 3.5):
        measured, bracket, calls = {0: truth(0)}, None, 0
        while True:
            position, bracket = lsearch.next_on_path(predicted, measured, budget, bracket)
            if position is None or abs(truth(position) - budget) <= 0.05 * budget:
                break
            measured[position] = truth(position)
            calls += 1
            assert calls <= 2 * math.ceil(math.log2(n)), f"{shape_of_truth} at {budget}: not converging"
        if position is None:  # closed: the budget falls between two neighbouring plans of the path
            over = max(i for i, ms in measured.items() if ms > budget)
            assert truth(over + 1) <= budget < truth(over)


def test_the_search_measures_the_paths_end_and_reads_noise_from_the_narrow_side():
    predicted = list(np.linspace(2.0, 0.2, 20))
    # Only the narrowest plan meets the budget and it was never measured: it is measured, not skipped.
    measured, bracket, picked = {0: 3.0}, None, []
    while (step := lsearch.next_on_path(predicted, measured, 0.5, bracket))[0] is not None:
        position, bracket = step
        picked.append(position)
        measured[position] = 0.4 if position == 19 else 0.9
    assert picked[-1] == 19 and len(picked) <= 8
    # Out of order (a noisy plan under the budget before one over it): the bracket starts past the last over.
    position, _ = lsearch.next_on_path(predicted, {0: 3.0, 5: 0.4, 8: 0.9, 12: 0.3}, 0.5, None)
    assert 8 < position < 12
    # Nothing measured over the budget: nothing wider to try.
    assert lsearch.next_on_path(predicted, {0: 0.3, 4: 0.2}, 0.5, None) == (None, 0)
    # The path's end measured over it: nothing left.
    assert lsearch.next_on_path(predicted, {0: 3.0, 19: 0.9}, 0.5, None)[0] is None


@pytest.mark.parametrize("power, ratio", [(0.3, 0.6), (3.0, 0.3)])
def test_a_device_the_table_mispredicts_is_met_by_measuring_along_the_path(power, ratio):
    """A device whose time is a power of the channels kept (the table, fitted near the unpruned network,
    misjudges deep cuts by a shape): round 1's knapsack plan misses, the rounds after it search the nested
    path through it and land within the tolerance in a few rounds (the knapsack-budget secant took 5–6)."""
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    full = {g.name: g.full for g in groups}
    Device = _device(groups, lambda widths: 0.05 + 0.95 * (sum(widths.values()) / sum(full.values())) ** power)
    cfg = PruneConfig(round_to=4, importance="l2",
                      latency={"ratio": ratio, "widths_per_group": 2, "rounds": 6, "tolerance": 0.05, "max_pruning_ratio": 1.0})
    search = lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Device(), lambda m: None)
    rounds = search["rounds"]
    assert abs(search["measured_ms"]["p50_ms"] - ratio) <= 0.05 * ratio
    assert 1 < len(rounds) <= 4, "round 1 missed; the path landed within three more"
    positions = [r["path_position"] for r in rounds]
    assert None not in positions and len(set(positions)) == len(positions), "round 1 is placed on the path too"
    assert {r["path_length"] for r in rounds} == {len(lsearch.nested_path(
        lmodel.restricted(search["table"], 1.0), search["importance"], rounds[0]["widths"]))}
    assert search["widths"] == rounds[-1]["widths"]

    # max_pruning_ratio bounds every group's cut (the table still measured every width: one cache for all);
    # a budget only deeper cuts reach is refused, naming the bound.
    cfg = cfg.model_copy(update={"latency": cfg.latency.model_copy(update={"max_pruning_ratio": 0.5})})
    if power < 1:  # half of every group costs 0.05 + 0.95 · 0.5^0.3 = 0.82 ms here
        with pytest.raises(StageError, match="below the narrowest plan's measured 0.82") as err:
            lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Device(), lambda m: None)
        assert "max_pruning_ratio" in err.value.fix
        return
    bounded = lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Device(), lambda m: None)
    assert all(w >= g.full / 2 for g in groups for w in [bounded["widths"][g.name]])
    assert all(w >= g.full / 2 for g in groups for r in bounded["rounds"] for w in [r["widths"][g.name]])
    assert bounded["tables"][0]["groups"] == search["tables"][0]["groups"]


def test_a_tables_context_is_measured_again_beside_its_networks(tmp_path):
    """The context the table's changes are taken against is re-measured in the same session as the
    networks, even when cached (a busy moment's cached time skewed a whole ResNet-50 table); a call in
    which everything is cached measures nothing. The client stands in for the agent (its jobs are not
    the subject here): each upload is one model, and every job of it reports its own fixed time."""
    from pipeline.core.recipe import LatencyTarget, parse_recipe
    from tests.results import job_result, run

    class Client:
        def __init__(self):
            self.jobs, self.uploads = {}, []

        def upload(self, path):
            self.uploads.append(path.name)
            return f"{len(self.uploads):064x}"

        def submit(self, spec):
            job_id = f"job-{len(self.jobs)}"
            self.jobs[job_id] = spec.artifact
            return {"id": job_id}

        def wait(self, job_id, **_):
            ms = 1.0 + int(self.jobs[job_id], 16)  # a later upload measures longer
            return {"state": "succeeded", "result": job_result("onnxruntime", "fp32", [run(1, ms, ms)])}

    recipe = parse_recipe(_tiny_raw())
    preprocess = {"input_size": 16, "resize": 16, "channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3}
    spec = measure.device_spec({"tensorrt": None}, recipe.deploy, LatencyTarget(ratio=0.5, precision="float"),
                               preprocess, "t")
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    full = {g.name: g.full for g in groups}
    client = Client()
    meter = measure.Meter(client, spec, {"agent": "stand-in"}, tmp_path / "cache", tmp_path / "onnx", 1, 17, SHAPE)
    first = meter.measure({"unpruned": channels.at_widths(model, "tiny_resnet", SHAPE, full)})["unpruned"]
    name = groups[0].name
    narrow = {"context": channels.at_widths(model, "tiny_resnet", SHAPE, full),
              "narrow": lambda: channels.at_widths(model, "tiny_resnet", SHAPE, {**full, name: groups[0].candidates[0]})}
    again = meter.measure(narrow, refresh=["context"])
    assert len(client.uploads) == 3 and meter.jobs == 3, "the cached context was measured again"
    assert again["context"].p50_ms != first.p50_ms
    cached = meter.measure(narrow, refresh=["context"])
    assert meter.jobs == 3 and cached["context"].p50_ms == again["context"].p50_ms, "all cached: nothing measured"


@pytest.fixture(scope="module")
@slow_fixture
def agent(tmp_path_factory):
    """A real loopback agent on which jobs labelled ``hang-me`` hang after loading (the tests' stand-in for a
    deadlocked runtime, which cannot be produced on purpose)."""
    from tests.device.agent_process import AgentProcess

    with AgentProcess(tmp_path_factory.mktemp("agent") / "data", env={"EDGEFOLD_AGENT_FAULT": "hang-me=hang"}) as process:
        yield process


def _meter(agent, tmp_path, label: str):
    from pipeline.core.recipe import LatencyTarget

    recipe = parse_recipe(_tiny_raw())
    preprocess = {"input_size": 16, "resize": 16, "channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3}
    spec = measure.device_spec({"tensorrt": None}, recipe.deploy,
                               LatencyTarget(ratio=0.5, precision="float", duration_s=0.1), preprocess, label)
    lines = []
    meter = measure.Meter(agent.client(), spec, {"agent": agent.url}, tmp_path / "cache", tmp_path / "onnx", 1, 17,
                          SHAPE, log=lines.append)
    return meter, lines


def test_a_truncated_cache_entry_is_measured_again_not_a_crash(agent, tmp_path):
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    meter, lines = _meter(agent, tmp_path, "cache")
    first = meter.measure({"m": model})["m"]
    (entry,) = (tmp_path / "cache").iterdir()
    text = entry.read_text()
    entry.write_text(text[: len(text) // 2])  # what a kill in the middle of the old plain write_text left
    again = meter.measure({"m": model})["m"]
    assert meter.jobs == 2 and meter.reused == 0, "the torn entry was measured again"
    assert any("unreadable" in line and "measuring it again" in line for line in lines), "with a warning"
    assert lmodel.Measurement.from_json(json.loads(entry.read_text())) == again and first.p50_ms > 0
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [entry.name], "no temporary file left beside it"


def test_a_latency_job_that_outlasts_the_wait_is_cancelled_not_taken_for_an_unreachable_agent(agent, tmp_path,
                                                                                              monkeypatch):
    from device.client import AgentClient

    # The agent kills a job at its own timeout_s and the meter waits 120 s longer: the wait runs out first only
    # when a job sat queued or the agent could not kill it. A 3 s wait stands in for both; the rest is real.
    wait = AgentClient.wait
    monkeypatch.setattr(AgentClient, "wait", lambda self, job_id, timeout_s=3600.0, **kw: wait(self, job_id, 3.0, **kw))
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    narrow = channels.at_widths(model, "tiny_resnet", SHAPE, {groups[0].name: groups[0].candidates[0]})
    meter, _ = _meter(agent, tmp_path, "hang-me")
    with pytest.raises(StageError) as err:
        meter.measure({"wide": model, "narrow": narrow})
    assert "did not end" in err.value.message and "unreachable" not in err.value.message
    assert "cancelled on the agent" in err.value.message and "DELETE /v1/jobs/" in err.value.fix
    with agent.client() as client:
        jobs = [job for job in client.jobs() if job["spec"]["label"] == "hang-me"]
    assert len(jobs) == 2 and {job["state"] for job in jobs} == {"cancelled"}, "both, the queued one too"


def _counting_device(groups, ms_of):
    """The stand-in meter of ``_device``, counting the networks it was asked to measure."""
    base = _device(groups, ms_of)

    class Counting(base):
        networks = 0

        def measure(self, models, refresh=(), fresh=()):
            type(self).networks += len(models)
            return super().measure(models, refresh, fresh)

    return Counting


def test_a_search_says_what_it_will_build_first_and_is_refused_over_the_cap():
    """Before measuring, the search logs how many networks (engines on TensorRT) it builds and how long that takes;
    over prune.latency.max_networks it is refused naming the key, having measured nothing."""
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    full = {g.name: g.full for g in groups}
    Device = _counting_device(groups, lambda w: 0.05 + 0.95 * sum(w.values()) / sum(full.values()))
    latency_cfg = {"ratio": 0.6, "widths_per_group": 3, "rounds": 4, "tolerance": 0.05, "holdout": 2}
    cost = lmodel.table_cost(groups, full, PruneConfig(round_to=4, latency=latency_cfg).latency, "tensorrt")
    assert cost["unit"] == "TensorRT engines" and cost["estimate_s"] >= cost["networks"] * 10, "a build is seconds"
    cfg = PruneConfig(round_to=4, importance="l2", latency={**latency_cfg, "max_networks": cost["networks"] - 1})
    with pytest.raises(ConfigError, match=f"would build {cost['networks']} onnxruntime sessions") as err:
        lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Device(), lambda m: None)
    assert "prune.latency.max_networks" in err.value.message and "widths_per_group" in err.value.fix
    assert Device.networks == 0, "refused before measuring anything"

    lines = []
    cfg = PruneConfig(round_to=4, importance="l2", latency=latency_cfg)
    search = lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Device(), lines.append)
    assert any(f"builds at most {cost['networks']} onnxruntime sessions ({cost['table_networks']} for the table)"
               in line for line in lines[:1]), "said first"
    assert cost["table_networks"] < Device.networks <= cost["networks"], "an upper bound that counts the table"


def test_the_tensorrt_table_shares_one_timing_cache_that_does_not_key_its_measurements(tmp_path):
    from pipeline.core.recipe import LatencyTarget

    recipe = parse_recipe(_tiny_raw())
    preprocess = {"input_size": 16, "resize": 16, "channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3}
    trt = measure.device_spec({"tensorrt": "10.3.0"}, recipe.deploy, LatencyTarget(ratio=0.5), preprocess, "t")
    ort = measure.device_spec({"tensorrt": None}, recipe.deploy, LatencyTarget(ratio=0.5), preprocess, "t")
    assert trt.runtime == "tensorrt" and trt.timing_cache == measure.TIMING_CACHE
    assert ort.runtime == "onnxruntime" and ort.timing_cache is None
    model = build_model("tiny_resnet", 10).eval()
    keys = [measure.Meter(None, spec, {"agent": "a"}, tmp_path / "c", tmp_path / "o", 1, 17, SHAPE)._cache_key(model)
            for spec in (trt, trt.model_copy(update={"timing_cache": None}))]
    assert keys[0] == keys[1], "the cache name changes build time, not what is measured"


def test_the_latency_model_steps_at_the_kernels_channel_multiple():
    """A device whose kernels pad channels to 16 (time steps at multiples of 16, flat between): with
    kernel_multiple 16 the model prices 20 and 32 channels alike and fits the staircase from the table's
    single-group changes; assuming latency smooth in the channel count (kernel_multiple 1) it cannot."""
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    stepped = lmodel.LayerModel.of(model, "tiny_resnet", SHAPE, groups, kernel_multiple=16)
    truth = np.concatenate([[0.02, 0.0], np.random.default_rng(0).uniform(0.5, 2.0, len(stepped.names))])

    def device(widths):
        return float(stepped.features(widths) @ truth)

    wide = next(g for g in groups if g.full >= 32)
    full = {g.name: g.full for g in groups}
    assert device({**full, wide.name: 20}) == device({**full, wide.name: 32}) > device({**full, wide.name: 16})
    samples = [(full, device(full))] + [({**full, g.name: w}, device({**full, g.name: w}))
                                        for g in groups for w in g.candidates[:-1]]
    plans = [{g.name: g.candidates[i % len(g.candidates)] for g in groups} for i in range(1, 6)]
    errors = {}
    for multiple in (16, 1):
        fitted = lmodel.LayerModel.of(model, "tiny_resnet", SHAPE, groups, kernel_multiple=multiple).fit(samples)
        errors[multiple] = max(abs(fitted.predict(p) - device(p)) / device(p) for p in plans)
        if multiple == 16:
            assert fitted.predict({**full, wide.name: 20}) == pytest.approx(fitted.predict({**full, wide.name: 32}))
    assert errors[16] < 0.03 and errors[1] > 2 * errors[16], errors


def test_the_tables_error_is_reported_on_plans_it_was_never_fitted_to(tmp_path):
    """Held-out plans are predicted, then measured, and never added to the fit; the report's latency section
    states their errors and plots predicted against measured."""
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    full = {g.name: g.full for g in groups}
    Device = _device(groups, lambda w: 0.05 + 0.95 * (sum(w.values()) / sum(full.values())) ** 2)
    cfg = PruneConfig(round_to=4, importance="l2", latency={"ratio": 0.5, "widths_per_group": 2, "rounds": 6,
                                                            "tolerance": 0.05, "holdout": 3, "max_pruning_ratio": 1.0})
    search = lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Device(), lambda m: None)
    holdout = search["holdout"]
    assert len(holdout) == 3
    fitted = [w for w, _ in search["table"].samples]
    rounds = [r["widths"] for r in search["rounds"]]
    for h in holdout:
        assert h["widths"] not in fitted and h["widths"] not in rounds, "never fitted, never a round"
        truth = 0.05 + 0.95 * (sum(h["widths"].values()) / sum(full.values())) ** 2
        assert h["measured_ms"]["p50_ms"] == pytest.approx(truth)
        assert h["error"] == pytest.approx((h["predicted_ms"] - truth) / truth)
    assert len({tuple(sorted(h["widths"].items())) for h in holdout}) == 3, "three different plans"

    from pipeline.report.sections import to_markdown_lines

    lat = {"budget_ms": search["budget_ms"], "device": "edge", "agent": "loopback", "unpruned_ms": search["unpruned_ms"],
           "predicted_ms": search["predicted_ms"], "measured_ms": search["measured_ms"], "prediction_error": 0.0,
           "rounds": len(rounds), "jobs": 1, "reused": 0, "plans": search["plans"], "sweep": search["sweep"],
           "check": None, "holdout": [{k: v for k, v in h.items() if k != "widths"} for h in holdout]}
    sections = report.latency_section({"stages": {"prune": {"metrics": {"latency": lat}}}}, tmp_path, tmp_path)
    text = "\n".join(to_markdown_lines(sections[0]))
    assert "Out of sample (the table was not fitted to these 3 plans)" in text
    assert f"{100 * holdout[0]['error']:+.1f}%" in text
    assert (tmp_path / "latency_holdout.png").stat().st_size > 1000 and "latency_holdout.png" in text


def test_taylor_importance_with_a_macs_target_is_configurable():
    """Arm A′ of the benchmark: the latency budget's knapsack and Taylor importance, MACs as the cost."""
    raw = _tiny_raw()
    raw["prune"].update(importance="taylor", max_pruning_ratio=0.8)
    prune = parse_recipe(raw).prune
    assert prune.importance == "taylor" and prune.macs_target is not None and prune.max_pruning_ratio == 0.8
    raw["prune"]["importance"] = "l2"
    with pytest.raises(ConfigError, match="max_pruning_ratio bounds the MACs target's knapsack"):
        parse_recipe(raw)


def test_the_macs_knapsack_meets_the_target_by_counted_macs_within_its_bound():
    from pipeline.models import count_macs

    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    batches = [(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))) for _ in range(2)]
    full_macs = count_macs(model, SHAPE)
    for target, bound in ((0.5, 0.9), (0.3, 0.9), (0.6, 0.5)):
        cfg = PruneConfig(round_to=4, importance="taylor", macs_target=target, max_pruning_ratio=bound)
        widths, groups, predicted = lsearch.macs_knapsack_plan(model, "tiny_resnet", cfg, SHAPE, batches)
        assert lsearch.MacsCost.of(model, "tiny_resnet", SHAPE, groups).predict(
            {g.name: g.full for g in groups}) == pytest.approx(1.0), "the cost is the MACs fraction"
        counted = count_macs(channels.at_widths(model, "tiny_resnet", SHAPE, widths), SHAPE) / full_macs
        assert predicted <= target + 1e-9 and counted == pytest.approx(predicted, rel=0.005), "the cost is the count"
        assert counted > target * (1 - cfg.tolerance), "filled to the target, not far under it"
        assert all(widths[g.name] >= (1 - bound) * g.full for g in groups), "no group cut past the bound"
    cfg = PruneConfig(round_to=4, importance="taylor", macs_target=0.3, max_pruning_ratio=0.2)
    with pytest.raises(StageError, match="below the narrowest plan the knapsack may choose") as err:
        lsearch.macs_knapsack_plan(model, "tiny_resnet", cfg, SHAPE, batches)
    assert "prune.max_pruning_ratio" in err.value.fix


@pytest.mark.slow  # prunes and fine-tunes the tiny teacher
def test_the_prune_stage_runs_the_macs_knapsack_with_taylor_importance(latency_teacher, tmp_path):
    from pipeline.runner import run_pipeline

    raw = yaml.safe_load(_latency_recipe(tmp_path).read_text())
    raw["prune"] = {"round_to": 4, "steps": 1, "macs_target": 0.5, "importance": "taylor"}
    recipe = tmp_path / "tiny_latency.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    ctx = run_pipeline(str(recipe), until="prune", runs_dir=_copy_of(latency_teacher, tmp_path / "runs", "a"), run_id="a")
    metrics = ctx.manifest.stage("prune")["metrics"]
    assert abs(metrics["macs_fraction"] - 0.5) <= 0.05 * 0.5 and metrics["plan"]["importance"] == "taylor"
    model, _ = load_checkpoint(ctx.run_dir / "prune" / "model.pt")
    groups = channels.prunable_groups(build_model("tiny_resnet", 10), "tiny_resnet", SHAPE, 4)
    assert channels.widths_of(model, groups) == metrics["plan"]["widths"]
    assert "pipeline.latency.budget" not in ctx.manifest.stage("prune")["code_modules"], "the MACs path only"


def test_a_budget_of_a_reference_is_measured_beside_every_plan_and_survives_a_drifting_device():
    """Arm B's budget is arm A's latency measured beside B's plans, never a cached figure: on a device that gets 15%
    slower with every call, each plan is judged by its ratio to the reference in its own call, and the chosen plan's
    true time lands on the reference's."""
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    full = {g.name: g.full for g in groups}

    def true_ms(widths):
        return 0.05 + 0.95 * (sum(widths.values()) / sum(full.values())) ** 1.5

    half = {g.name: g.candidates[len(g.candidates) // 2] for g in groups}
    reference = channels.at_widths(model, "tiny_resnet", SHAPE, half)

    class Drifting:
        calls, fresh_seen = 0, []

        def measure(self, models, refresh=(), fresh=()):
            type(self).calls += 1
            drift = 1.15 ** self.calls
            if "reference" in models:
                type(self).fresh_seen.append(set(fresh))
            out = {}
            for name, m in models.items():
                ms = true_ms(channels.widths_of(m if isinstance(m, torch.nn.Module) else m(), groups)) * drift
                out[name] = lmodel.Measurement(ms, (ms, ms), [ms])
            return out

    cfg = PruneConfig(round_to=4, importance="l2", latency={"ratio": 1.0, "reference": "a.pt", "widths_per_group": 2,
                                                            "rounds": 6, "tolerance": 0.05, "holdout": 0,
                                                            "max_pruning_ratio": 1.0})
    search = lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Drifting(), lambda m: None, reference=reference)
    assert abs(true_ms(search["widths"]) - true_ms(half)) <= 0.05 * true_ms(half) + 1e-9
    assert all("reference_ms" in r for r in search["rounds"]), "the reference measured beside every round's plan"
    assert Drifting.fresh_seen[0] == {"reference"} and all(f == {"plan", "reference"} for f in Drifting.fresh_seen[1:])
    assert len(Drifting.fresh_seen) == 1 + len(search["rounds"])
    with pytest.raises(ValueError, match="reference needs ratio"):
        PruneConfig(latency={"ms": 1.0, "reference": "a.pt"})


def test_an_unpruned_network_within_the_budget_is_a_plan_not_a_refusal():
    """A device on which any cut saves 30% at once (a step) and the budget is just under the unpruned time: every
    pruned plan lands far under it, but the unpruned network is within the tolerance and is shipped as the plan."""
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    groups = channels.prunable_groups(model, "tiny_resnet", SHAPE, 4)
    full = {g.name: g.full for g in groups}
    Device = _device(groups, lambda w: 1.0 if w == full else 0.7)
    cfg = PruneConfig(round_to=4, importance="l2", latency={"ratio": 0.98, "widths_per_group": 2, "rounds": 4,
                                                            "tolerance": 0.05, "holdout": 0})
    lines = []
    search = lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Device(), lines.append)
    assert search["widths"] == full and search["rounds"][-1].get("unpruned")
    assert any("within the budget" in line for line in lines)
    cfg = cfg.model_copy(update={"latency": cfg.latency.model_copy(update={"ratio": 0.9})})
    with pytest.raises(StageError, match="no measured plan came near the budget"):
        lbudget.plan_to_budget(model, "tiny_resnet", cfg, SHAPE, Device(), lambda m: None)

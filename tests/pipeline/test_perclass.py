"""What the fold forgot: per-class results, paired tests, data balance, an honest headline, grouped pruning."""

import json
import shutil

import numpy as np
import pytest
import torch

from device.errors import ConfigError
from pipeline.perclass import class_changes, holm, mcnemar_exact, per_class, summarize
from pipeline.runner import run_pipeline
from pipeline.core.rungs import RUNGS
from pipeline.tasks.classification.images import data_set, recorded_splits

from tests.pipeline.test_integrity import write_digits_folder


# ------------------------------------------------------------------ statistics with known answers
def test_mcnemar_exact_known_values():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64)  # six of six disagreements one way
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(1, 9) == pytest.approx(2 * (1 + 10) / 1024)


def test_holm_adjustment():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]


def test_per_class_scores_and_confusion():
    labels = np.array([0, 0, 1, 1, 2, 2])
    predicted = np.array([0, 1, 1, 1, 1, 1])
    scores = per_class(labels, predicted, 3)
    assert scores["accuracy"] == [0.5, 1.0, 0.0]
    assert scores["precision"] == [1.0, 0.4, None]
    assert scores["confusion"] == [[1, 1, 0], [0, 2, 0], [0, 2, 0]]
    summary = summarize(labels, {"teacher": labels, "student": predicted}, ["a", "b", "c"])
    assert summary["rungs"]["student"]["never_predicted"] == ["c"]
    assert summary["rungs"]["teacher"]["never_predicted"] == []


def test_a_drop_within_noise_is_not_flagged_and_a_real_one_is():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 100)
    before = labels.copy()
    noisy = labels.copy()
    flip = rng.choice(400, size=4, replace=False)  # four images spread over the classes
    noisy[flip] = (noisy[flip] + 1) % 4
    rows = class_changes(labels, before, noisy, ["a", "b", "c", "d"])
    assert not any(r["significant"] for r in rows)
    broken = labels.copy()
    broken[labels == 2] = np.where(np.arange(100) < 40, 3, 2)  # class c loses 40 of 100
    rows = class_changes(labels, before, broken, ["a", "b", "c", "d"])
    assert rows[0]["class"] == "c" and rows[0]["change_points"] == -40.0 and rows[0]["significant"]
    assert [r["significant"] for r in rows[1:]] == [False, False, False]


# ------------------------------------------------------------------ the default run's report
@pytest.mark.slow
def test_default_run_reports_per_class_results(tiny_run):
    report = tiny_run.run_dir / "report"
    assert "## What the fold cost, per class" in (report / "report.md").read_text()
    html = (report / "report.html").read_text()
    assert "What the fold cost, per class" in html and 'alt="per_class"' in html
    results = json.loads((report / "results.json").read_text())
    per = results["per_class"]
    assert set(per["accuracy"]) == {"teacher", "pruned", "student", "student_fp16", "student_int8"}
    assert len(per["accuracy"]["teacher"]) == 10
    assert [c["before"] + "→" + c["after"] for c in per["comparisons"]] == ["teacher→student", "student→student_int8",
                                                                            "teacher→student_int8"]
    # The whole fold's overall test (teacher → the rung the headline leads with: the INT8 student, or the student
    # form the device ran where it ran no INT8 compute) is the headline's accuracy evidence, on every test image.
    lead = results["headline"]["lead_rung"]
    whole = next(c for c in per["comparisons"] if c["before"] == "teacher" and c["after"] == lead)["overall"]
    assert whole["images"] == tiny_run.manifest.stage("teacher")["metrics"]["images"]
    assert results["headline"]["accuracy_p"] == whole["p_value"] and results["headline"]["per_class_tested"]
    evaluated = json.loads((tiny_run.run_dir / "evaluate" / "per_class.json").read_text())
    confusion = np.array(evaluated["rungs"]["teacher"]["confusion"])
    assert confusion.sum() == tiny_run.manifest.stage("teacher")["metrics"]["images"]
    assert np.trace(confusion) == tiny_run.manifest.stage("teacher")["metrics"]["top1_correct"]


@pytest.mark.slow
def test_collapsed_rung_is_named_collapsed_not_chance(tiny_run):
    from pipeline.tasks.classification.scores import verdict

    pruned = tiny_run.manifest.stage("evaluate")["metrics"]["rungs"]["pruned"]
    report = (tiny_run.run_dir / "report" / "report.md").read_text()
    # The report says of the pruned rung what its recorded sanity facts give, whichever they are.
    ladder = report.split("## The ladder", 1)[1].split("\n## ", 1)[0].splitlines()
    columns = [c.strip() for c in next(line for line in ladder if line.startswith("| rung |")).strip("|").split("|")]
    row = next(line for line in ladder if line.startswith("| pruned | loopback |"))  # the ladder's own table
    said = verdict("pruned", pruned)
    cell = [c.strip() for c in row.strip("|").split("|")][columns.index("top-1 host")]  # then the verdict's words
    assert cell == f"{100 * pruned['top1']:.2f}%" + (f" {said.split(':')[0]}" if said else ""), (said, row)
    assert ("collapsed" in cell) == bool(pruned["sanity"]["collapsed"]), row

    facts = {"sanity": {"collapsed": True, "at_chance": True, "top_predicted_class": "Bag",
                        "top_predicted_share": 1.0}}
    assert verdict("pruned", facts).startswith("collapsed: predicts 'Bag' for 100% of images")
    assert "expected before distillation" in verdict("pruned", facts)
    assert verdict("student", {"sanity": {"collapsed": False, "at_chance": True}}) == "at chance"


# ------------------------------------------------------------------ data balance, larger students
def test_imbalanced_folder_warns_where_data_enters(tmp_path, capsys):
    data = write_digits_folder(tmp_path / "data", classes=4, train_per_class=60, val_per_class=15)
    small = sorted((data / "train" / "digit3").glob("*.png"))
    for path in small[8:]:
        path.unlink()
    recipe = tmp_path / "imb.yaml"
    recipe.write_text(json.dumps({
        "name": "imb", "data": {"source": f"imagefolder:{data}", "calib_size": 16},
        "preprocess": {"input_size": 16, "channels": 3, "mean": [0.3] * 3, "std": [0.38] * 3},
        "teacher": {"arch": "tiny_resnet", "train": {"epochs": 1, "lr": 0.005}},
        "prune": {"macs_target": 0.5, "round_to": 4}, "distill": {"train": {"epochs": 1, "lr": 0.003}}}))
    ctx = run_pipeline(str(recipe), runs_dir=tmp_path / "runs", until="data")
    err = capsys.readouterr().err
    assert "1 classes have fewer than 20 training images: digit3 (8)" in err
    assert "imbalanced: the largest class has 7.5× the images of the smallest" in err
    assert "data.class_balance: loss_weights" in err
    metrics = ctx.manifest.stage("data")["metrics"]
    assert metrics["train_per_class"]["digit3"] == 8 and len(metrics["warnings"]) == 3


def test_class_balanced_loss_weights(tmp_path):
    from pipeline.tasks.classification.train import class_weights

    ctx = run_pipeline("tiny", runs_dir=tmp_path, until="data", overrides={"data.class_balance": "loss_weights"})
    weights = class_weights(ctx, torch.device("cpu"))
    counts = np.bincount(data_set(ctx).train.labels[recorded_splits(ctx)["train"]], minlength=10)
    assert weights is not None and float((weights * torch.tensor(counts)).sum()) == pytest.approx(counts.sum())


def test_a_student_larger_than_its_teacher_is_refused_before_training(tmp_path):
    overrides = {"teacher.arch": "mobilenet_v3_small", "distill.student": "resnet18"}
    with pytest.raises(ConfigError, match=r"distill.student resnet18 is not smaller than teacher mobilenet_v3_small") \
            as err:
        run_pipeline("tiny", runs_dir=tmp_path, overrides=overrides)
    assert "distill.allow_larger_student" in err.value.fix
    assert not list(tmp_path.glob("tiny/*/data")), "refused before the data stage"


# ------------------------------------------------------------------ grouped convolutions
@pytest.mark.slow  # prunes a RegNet
def test_grouped_convolutions_are_pruned_by_whole_groups():
    from pipeline.models import build_model, count_macs
    from pipeline.core.recipe import PruneConfig
    from pipeline.prune.ratio import grouped_convs, make_pruner
    from pipeline.tasks.classification.pruned import _conv_shapes, unpruned_layers

    model = build_model("regnet_y_400mf", 10)
    shape = (1, 3, 32, 32)
    base = count_macs(model, shape)
    before = {id(conv): (conv.out_channels, conv.groups, conv.out_channels // conv.groups)
              for conv in grouped_convs(model)}
    shapes = _conv_shapes(model)
    cfg = PruneConfig(macs_target=0.5, round_to=8)
    pruner = make_pruner(model, "regnet_y_400mf", cfg, {"ratio": 0.3, "harder_ratio": 0.3}, shape)
    pruner.step()
    after = grouped_convs(model)
    assert len(after) == len(before)
    for conv in after:
        channels, groups, width = before[id(conv)]
        assert conv.out_channels // conv.groups == width, "each group keeps its width"
        assert conv.out_channels % 8 == 0, "the kept group count keeps widths on round_to"
        assert conv.groups < groups, "whole groups were removed"
        assert conv.weight.shape == (conv.out_channels, width, 3, 3)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert count_macs(model, shape) < 0.8 * base
    assert unpruned_layers(shapes, model, "regnet_y_400mf", 8) == []


def test_layers_kept_whole_are_listed_with_the_reason():
    from pipeline.models import build_model
    from pipeline.tasks.classification.pruned import unpruned_layers

    model = build_model("regnet_y_400mf", 10)
    shapes = {name: (m.in_channels, m.out_channels, m.groups) for name, m in model.named_modules()
              if isinstance(m, torch.nn.Conv2d)}
    kept = unpruned_layers(shapes, model, "regnet_y_400mf", 8)  # nothing pruned: everything is listed
    grouped = [k for k in kept if k["groups"] > 1]
    assert grouped and "groups of 8 channels" in grouped[0]["reason"]


def test_a_concentrated_cut_is_named():
    from pipeline.tasks.classification.pruned import macs_concentration

    before = {"a": 100, "b": 100, "c": 100, "d": 1000, "e": 10}
    after = {"a": 90, "b": 90, "c": 90, "d": 100, "e": 5}
    result = macs_concentration(before, after)
    assert result["warning"] and "came from 3 of 5 pruned layers (d, a, b)" in result["warning"]
    even = macs_concentration({k: 100 for k in "abcdef"}, {k: 50 for k in "abcdef"})
    assert even["warning"] is None


@pytest.mark.slow
def test_report_headline_says_directions_in_words(tiny_run):
    from pipeline.report.headline import direction

    assert direction(2.31, "faster", "slower") == "2.31× slower"
    assert direction(0.5, "faster", "slower") == "2.00× faster"
    text = (tiny_run.run_dir / "report" / "report.md").read_text()
    headline = text.split("## Headline", 1)[1].split("## The ladder", 1)[0]
    h = json.loads((tiny_run.run_dir / "report" / "results.json").read_text())["headline"]
    lead = RUNGS[h["lead_rung"]].precision.upper()
    assert f"student {lead} on loopback vs teacher FP32 on loopback" in headline
    if h["int8_not_measured"]:  # ONNX Runtime's CPU provider runs the Q/DQ graph unfused: said, with the fix
        assert h["lead_rung"] != "student_int8" and "| INT8 rung | not measured as INT8 on loopback" in headline
        assert "EDGE=http://&lt;jetson>:8765" in headline, "a placeholder a Markdown renderer would take for a tag"
    else:
        assert h["lead_rung"] == "student_int8"
    # The latency line says the direction the recorded ratio and its interval give, and only that one.
    low, ratio, high = h["latency_ratio_low"], h["latency_ratio"], h["latency_ratio_high"]
    assert low <= ratio <= high and h["latency_ratio_significant"] == (not low <= 1 <= high)
    (latency,) = [line for line in headline.splitlines() if line.startswith("| latency p50 |")]
    said = {word for word in ("faster,", "slower,", "no measurable difference") if word in latency}
    expected = "no measurable difference" if low <= 1 <= high else "faster," if ratio < 1 else "slower,"
    assert said == {expected}, latency
    assert f"[{low:.2f}, {high:.2f}] over {h['latency_windows']} paired windows" in latency
    assert "size, FP32" in headline and f"deployed {lead}" in headline
    assert "not measured vs not measured" not in headline

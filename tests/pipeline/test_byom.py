"""Bring your own model, end to end as a user runs it: a timm architecture with attention through ``make edge`` on an
ImageFolder, and a module of the user's own registered by an installed package's entry point.

The ImageFolder is scikit-learn's digits written as PNG files; the models are made by the tests (nothing is
downloaded). Each run takes about a minute on two cores.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.arch_plugin import install

pytestmark = pytest.mark.slow


def digits_folder(root: Path, train: int = 600, val: int = 300) -> Path:
    """scikit-learn's 8×8 digits as an ImageFolder (``train/<class>/*.png``, ``val/…``)."""
    import cv2
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.images))
    for split, chosen in (("train", order[:train]), ("val", order[train:train + val])):
        for index in chosen:
            folder = root / split / f"digit{digits.target[index]}"
            folder.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(folder / f"{index}.png"), (digits.images[index] * 16).clip(0, 255).astype(np.uint8))
    return root


def recipe(repo: Path, path: Path, **changes) -> Path:
    """The tiny recipe, changed: ``changes`` maps dotted keys to values (None deletes the key)."""
    raw = yaml.safe_load((repo / "models" / "tiny.yaml").read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = raw
        for key in parents:
            node = node[key]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    raw["name"] = path.stem
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def manifest(runs: Path, name: str) -> dict:
    return json.loads((runs / name / "latest" / "manifest.json").read_text())


def test_a_timm_vit_goes_through_make_edge_with_the_preprocessing_of_its_pretrained_cfg(repo, tmp_path):
    """timm's test_vit: attention, LayerNorm and Softmax through prune (attention kept whole and named), FP16 and
    INT8 on an ImageFolder, the preprocessing left to timm (160 px, bicubic), measured on a loopback agent."""
    pytest.importorskip("timm")
    if subprocess.run(["which", "make"], capture_output=True).returncode:
        pytest.skip("make is not installed")
    data = digits_folder(tmp_path / "digits")
    path = recipe(repo, tmp_path / "byom-vit.yaml", **{
        "preprocess": None, "teacher.arch": "timm/test_vit", "teacher.train.epochs": 8, "teacher.train.lr": 0.001,
        "distill.train.epochs": 3, "distill.train.lr": 0.001, "prune.macs_target": 0.7, "data.calib_size": 64})
    venv = Path(sys.prefix)
    result = subprocess.run(["make", "-s", f"VENV={venv}", "-o", f"{venv}/.edgefold-installed", "edge",
                             f"MODEL={path}", f"DATA=imagefolder:{data}", f"RUNS={tmp_path / 'runs'}"],
                            cwd=repo, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr  # the run's log is on stderr, the ladder on stdout
    assert "preprocess from timm/test_vit's pretrained_cfg (timm " in said
    assert "160×160 (shorter side 168, bicubic)" in said
    stages = manifest(tmp_path / "runs", "byom-vit")["stages"]
    assert stages["data"]["metrics"]["num_classes"] == 10 and stages["data"]["metrics"]["train"] == 600
    whole = stages["prune"]["metrics"]["kept_whole"]
    assert [w["layer"] for w in whole] == [f"blocks.{i}.attn" for i in range(len(whole))] and whole
    fp16 = stages["export"]["metrics"]["rungs"]["student_fp16"]
    assert fp16["calibration_parity"]["images"] == 16 and fp16["calibration_parity"]["nonfinite"] == 0
    # teacher, pruned, student, student_fp16 and student_int8, each measured on the loopback agent
    assert stages["deploy"]["metrics"]["jobs_succeeded"] == stages["deploy"]["metrics"]["jobs"] == 5
    assert (tmp_path / "runs" / "byom-vit" / "latest" / "report" / "report.html").is_file()


def test_a_module_registered_by_an_installed_package_goes_through_the_ladder(repo, tmp_path):
    """A package the user installs registers ``my_net``; a recipe names the key (never the code) and the whole
    ladder runs on it, the device rebuilding it from the checkpoint by the same key."""
    plugin = install(tmp_path, "edgefold-test-arch", 'my_net = "edgefold_test_arch:MY_NET"')
    env = {**os.environ, "PYTHONPATH": str(plugin)}
    path = recipe(repo, tmp_path / "byom-plugin.yaml", **{"teacher.arch": "my_net", "prune.round_to": 2})
    result = subprocess.run([sys.executable, "-m", "pipeline", "run", str(path), "--runs-dir", str(tmp_path / "runs")],
                            capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    stages = manifest(tmp_path / "runs", "byom-plugin")["stages"]
    assert stages["teacher"]["metrics"]["top1"] > 0.5
    # the package's version and code are part of the teacher's cache key
    assert stages["teacher"]["config"]["teacher"]["arch_fingerprint"].startswith("edgefold-test-arch 1.2.3, ")
    assert stages["prune"]["metrics"]["macs_fraction"] < 0.75
    assert stages["deploy"]["metrics"]["jobs_succeeded"] == stages["deploy"]["metrics"]["jobs"] == 5
    without = subprocess.run([sys.executable, "-m", "pipeline", "recipe", str(path)], capture_output=True, text=True,
                             cwd=tmp_path)
    assert without.returncode == 2 and "unknown architecture 'my_net'" in without.stderr


FOLDED_LADDER = {"preprocess.input_size": 32, "data.train_size": 512, "data.test_size": 192, "data.calib_size": 64,
                 "teacher.train.epochs": 3, "teacher.train.lr": 0.002, "distill.train.epochs": 1,
                 "distill.train.lr": 0.001, "prune.round_to": 8, "export.parity_images": 64}


@pytest.mark.parametrize("name, changes", [
    ("fastvit_t8", {}),  # pruned in its folded form: before, its pruned copy failed to run and no student was reached
    ("repvit_m0_9", {}),  # two heads, folded into one: before, refused before any stage
    ("fastvit_t8", {"prune": None, "distill.student": "mobilenet_v3_small"}),  # distilled without pruning
])
def test_a_reparameterisable_or_two_headed_timm_teacher_reaches_an_int8_student(tmp_path, name, changes):
    """timm's FastViT and RepViT as teachers, on digits at 32 px (a few hundred images: the plumbing, not the method):
    every stage to evaluate runs; the pruned rung is pruned in the folded form and exported without folding twice
    (parity checked by the export stage), and a teacher distilled without pruning has no pruned rung."""
    pytest.importorskip("timm")
    from pipeline.runner import run_pipeline

    ctx = run_pipeline("tiny", runs_dir=tmp_path, until="evaluate",
                       overrides={**FOLDED_LADDER, "teacher.arch": f"timm/{name}", **changes})
    stages = ctx.manifest.data["stages"]
    rungs = stages["evaluate"]["metrics"]["rungs"]
    assert rungs["teacher"]["top1"] > 0.4 and rungs["student_int8"]["top1"] > 0.3, "well above chance (10%)"
    exported = stages["export"]["metrics"]["rungs"]
    assert exported["teacher"]["branches_folded"], "the teacher is exported folded"
    if "prune" in changes:
        assert "prune" not in stages and "pruned" not in rungs and "pruned" not in exported
        assert set(rungs) == {"teacher", "student", "student_fp16", "student_int8"}
    else:
        assert stages["prune"]["metrics"]["folded"]
        assert abs(stages["prune"]["metrics"]["macs_fraction"] - 0.5) <= 0.1 * 0.5
        assert not exported["student"]["branches_folded"], "the folded student is not folded again"
        whole = [w["layer"] for w in stages["prune"]["metrics"]["kept_whole"]]
        assert any("downsample" in layer for layer in whole) == (name == "fastvit_t8")

"""The seeds benchmark runs a real recipe, records a failed gate instead of stopping, and the README's figures come
from its result files only."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_two_seeds_of_tiny_record_every_run_and_the_machine(repo, tmp_path):
    out = tmp_path / "results"
    result = subprocess.run([sys.executable, "bench/recipe_seeds.py", "--recipe", "tiny", "--seeds", "2",
                             "--until", "evaluate", "--work", str(tmp_path / "work"), "--out", str(out)],
                            cwd=repo, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.startswith("goal: ")  # the goal is said before any run
    doc = json.loads(next(out.glob("seeds-tiny-*.json")).read_text())
    assert [run["seed"] for run in doc["runs"]] == [0, 1] and doc["summary"]["goal_met"]
    assert doc["runs"][0]["overrides"] == {"data.seed": 0, "teacher.train.seed": 0, "distill.train.seed": 0}
    assert doc["runs"][0]["teacher"] != doc["runs"][1]["teacher"] or doc["runs"][0]["student"] != doc["runs"][1]["student"]
    assert doc["machine"]["cpu"] and doc["machine"]["kernels"].split(" (forced")[0] in ("AVX-512", "AVX2", "other")
    provenance = doc["provenance"]
    assert provenance["data"] == "digits at 16 px" and len(provenance["lock_sha256"]) == 64
    assert provenance["commit"] is None or len(provenance["commit"].split("+")[0]) == 40
    assert all(run["quantize_method"] in ("max", "percentile", "entropy") for run in doc["runs"])
    summary = doc["summary"]["INT8"]
    assert summary["n"] == 2 and summary["low"] <= summary["mean"] <= summary["high"]


def _seeds_file(folder, recipe, stamp, teacher, passed=5):
    figure = {"mean": teacher, "low": teacher - 1, "high": teacher + 1, "n": 5}
    doc = {"schema": "edgefold.bench.seeds/1", "recipe": recipe, "date": "2026-12-02",
           "machine": {"cpu": "Planted CPU", "cores": 2, "kernels": "AVX2", "vector_flags": ["avx2"]},
           "runs": [], "summary": {"seeds": 5, "passed": passed, "goal_met": passed == 5, "teacher": figure,
                                   "student": figure, "INT8": figure, "int8_drop_points": figure, "seconds": figure}}
    (folder / f"seeds-{recipe}-{stamp}.json").write_text(json.dumps(doc))


def test_the_readme_figures_block_is_written_from_the_newest_files_and_checked(repo, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_figures", repo / "bench" / "readme_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    BEGIN, END, main = figures.BEGIN, figures.END, figures.main

    results = tmp_path / "results"
    results.mkdir()
    _seeds_file(results, "tiny", "20261201-000000", 90.0)
    _seeds_file(results, "tiny", "20261202-000000", 97.5, passed=4)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BEGIN}\nold\n{END}\noutro\n")
    assert main(["--readme", str(readme), "--results", str(results), "--check"]) == 1
    assert main(["--readme", str(readme), "--results", str(results)]) == 0
    text = readme.read_text()
    # A file from before provenance was recorded names its recipe's data set.
    assert "| tiny | digits at 16 px | 4 of 5 | 97.50 [96.50, 98.50] |" in text and "90.00" not in text
    assert "Planted CPU, 2 cores, AVX2" in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert main(["--readme", str(readme), "--results", str(results), "--check"]) == 0


def test_forced_kernels_are_recorded_and_get_a_row_of_their_own(repo, tmp_path, monkeypatch):
    """PyTorch's AVX2 kernels forced on an AVX-512 CPU are another experiment: the machine record says so, and the
    README keeps the native and the forced rows both."""
    import importlib.util

    def load(name):
        spec = importlib.util.spec_from_file_location(name, repo / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    seeds, figures = load("recipe_seeds"), load("readme_figures")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    kernels = seeds.machine()["kernels"]
    assert kernels.startswith("AVX2 (forced: ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2; the CPU has ")
    results = tmp_path / "results"
    results.mkdir()
    _seeds_file(results, "tiny-det", "20261203-000000", 18.0)
    _seeds_file(results, "tiny-det", "20261203-000001", 17.0)
    forced = results / "seeds-tiny-det-20261203-000001.json"
    doc = json.loads(forced.read_text())
    doc["machine"]["kernels"] = kernels
    forced.write_text(json.dumps(doc))
    rows = [line for line in figures.block(figures.newest_by_recipe(results)).splitlines() if line.startswith("| tiny-det")]
    assert len(rows) == 2 and any("forced" in row for row in rows) and any("18.00" in row for row in rows)


def test_a_resumed_bench_keeps_only_the_seeds_this_code_and_recipe_ran(repo, tmp_path, monkeypatch):
    """Resuming keeps a seed's record only when it ran the same sources and recipe: after a change to either, the
    recorded seeds are another experiment and run again (once they were reported as today's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("recipe_seeds", repo / "bench" / "recipe_seeds.py")
    seeds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seeds)
    recorded = json.loads(next((repo / "bench" / "results").glob("seeds-tiny-*.json")).read_text())["runs"][0]
    ran = []
    monkeypatch.setattr(seeds, "one_run", lambda recipe, seed, runs, until: ran.append(seed) or dict(recorded, seed=seed))
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "state.json").write_text(json.dumps({"experiment": "other code", "0": dict(recorded, teacher=1.0)}))
    assert seeds.main(["--recipe", "tiny", "--seeds", "1", "--work", str(work), "--out", str(out)]) == 0
    assert ran == [0], "a seed recorded by other code runs again"
    doc = json.loads(next(out.glob("seeds-tiny-*.json")).read_text())
    assert doc["experiment"] == seeds.experiment_key("tiny") and doc["runs"][0]["teacher"] != 1.0
    assert seeds.main(["--recipe", "tiny", "--seeds", "1", "--work", str(work), "--out", str(out)]) == 0
    assert ran == [0], "the same code and recipe resume"

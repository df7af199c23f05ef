"""The README is a guide that stays true: every generated part is what the recorded files say, every paragraph that
speaks of a Jetson, TensorRT or a GPU says where it was measured, every figure names its data set, no machine's path
leaks, the Makefile's variables are all in its table (bench/readme_figures.py holds the rules; these tests plant a
fault in a copy and see each rule fail)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import pytest


@pytest.fixture(scope="module")
def figures(repo):
    spec = importlib.util.spec_from_file_location("readme_figures", repo / "bench" / "readme_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def copy(repo, tmp_path, figures, monkeypatch):
    """The repository's README and device/README.md in a folder of their own, the rules pointed at them."""
    shutil.copy(repo / "README.md", tmp_path / "README.md")
    (tmp_path / "device").mkdir()
    shutil.copy(repo / "device" / "README.md", tmp_path / "device" / "README.md")
    monkeypatch.setattr(figures, "REPO", tmp_path)
    return tmp_path / "README.md"


def check(figures, readme) -> list[str]:
    return figures.rule_problems(readme) + (
        [] if figures.render(readme.read_text(), figures.HERE / "results") == readme.read_text() else ["stale"])


def test_the_readme_is_what_its_recorded_files_say_and_keeps_its_rules(repo):
    result = subprocess.run(["python", "bench/readme_figures.py", "--check"], cwd=repo, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_copy_passes_before_anything_is_planted(figures, copy):
    assert check(figures, copy) == []


def test_a_stale_console_block_fails(figures, copy):
    text = copy.read_text()
    begin = text.index("<!-- example:tiny:begin -->")
    line = text.index("\n[ teacher]", begin)
    copy.write_text(text[:line] + "\n[ teacher] done in 0.1 s  top-1 100.00%" + text[text.index("\n", line + 1):])
    assert check(figures, copy) == ["stale"]


def test_a_device_claim_without_its_place_of_measurement_fails(figures, copy):
    copy.write_text(copy.read_text() + "\nOn an Orin Nano the INT8 rung runs 3× faster than FP16.\n")
    claims = [p for p in check(figures, copy) if "speaks of" in p]
    assert len(claims) == 1 and "speaks of Orin without saying where it was measured" in claims[0]
    device_readme = copy.parent / "device" / "README.md"
    device_readme.write_text(device_readme.read_text() + "\nDLA halves the energy per image.\n")
    assert any("README.md: a paragraph speaks of DLA" in p for p in check(figures, copy))


def test_a_figure_without_its_data_set_fails(figures, copy):
    text = copy.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| tiny |"))
    cells = row.split("|")
    cells[2] = " "  # the data set's cell emptied
    copy.write_text(text.replace(row, "|".join(cells)))
    problems = check(figures, copy)
    assert "stale" in problems and any("a figures row without its data set" in p for p in problems)


def test_a_machines_path_fails(figures, copy):
    copy.write_text(copy.read_text().replace("## Install", "## Install\n\nSee /home/ci/edgefold/runs for more.\n", 1))
    assert any("a machine's path '/home/c'" in p for p in check(figures, copy))


def test_the_readme_is_short_has_its_picture_and_sections(repo):
    text = (repo / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    picture = re.search(r"!\[[^\]]+\]\(([^)]+\.png)\)", text)
    assert picture and (repo / picture.group(1)).stat().st_size > 10_000
    for section in ("## Install", "## Two commands", "## Compatibility", "## Troubleshooting", "## Ship the chosen rung",
                    "## Status"):
        assert section in text, section
    assert (repo / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "Apache-2.0" in (repo / "setup.cfg").read_text() and (repo / "CHANGELOG.md").is_file()


def test_every_makefile_variable_is_in_the_readmes_table(repo):
    makefile = (repo / "Makefile").read_text()
    variables = set(re.findall(r"^([A-Z_]+)\s*\?=", makefile, flags=re.M))
    table = (repo / "README.md").read_text().split("| variable | default | meaning |", 1)[1].split("\n\n", 1)[0]
    missing = sorted(v for v in variables if f"`{v}`" not in table)
    assert not missing, f"Makefile variables not in the README's table: {missing}"


def test_make_help_names_every_stage_of_edge(repo):
    result = subprocess.run(["make", "-s", "help"], cwd=repo, capture_output=True, text=True, timeout=60)
    line = next(line for line in result.stdout.splitlines() if line.startswith("make edge MODEL=resnet50"))
    assert "deploy → report" in line and "make ship" in result.stdout

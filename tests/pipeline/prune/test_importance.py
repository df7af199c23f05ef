"""One importance map (:mod:`pipeline.prune.importance`): every pruner takes its estimator from there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from device.errors import ConfigError
from pipeline.prune.importance import NAMES, estimator, torch_pruning

ROOT = Path(__file__).resolve().parents[3]


def test_each_recipe_name_is_one_estimator_and_a_wrong_one_names_the_choices():
    tp = torch_pruning()
    for name, p in (("l1", 1), ("l2", 2), ("auto", 2)):
        built = estimator(name)
        assert type(built) is tp.importance.GroupMagnitudeImportance and built.p == p and built.normalizer == "mean"
    taylor = estimator("taylor")
    assert type(taylor) is tp.importance.GroupTaylorImportance and taylor.normalizer is None
    with pytest.raises(ConfigError, match="'l3' is not an importance estimator") as err:
        estimator("l3")
    assert all(name in err.value.fix for name in NAMES)


def test_no_other_module_builds_an_importance_estimator():
    """The MACs ratio, the knapsack's scores and the detector's pruner read the same map: a second one built
    elsewhere (as three were) would let the tasks' pruning drift apart."""
    building = re.compile(r"importance\.\w*Importance\(")
    found = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "pipeline").rglob("*.py")
                   if building.search(path.read_text()) and path.name != "importance.py")
    assert found == []

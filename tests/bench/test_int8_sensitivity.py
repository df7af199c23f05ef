"""The INT8 sensitivity benchmark on a real finished run: three orders walked over the same k, each candidate written
by the quantizer and scored, every run recorded with the machine; its goal rule."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_the_three_orders_are_walked_on_a_real_run(repo, tiny_run, tmp_path):
    result = subprocess.run([sys.executable, "bench/int8_sensitivity.py", "--runs", str(tiny_run.run_dir),
                             "--per-tensor", "--ks", "0,1,2", "--out", str(tmp_path)],
                            cwd=repo, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.startswith("goal: ")  # said before any run
    doc = json.loads(next(tmp_path.glob("int8-sensitivity-tiny-*.json")).read_text())
    assert doc["per_tensor"] and doc["machine"]["cpu"] and doc["ks"] == [0, 1, 2]
    run = doc["runs"][0]
    assert set(run["curves"]) == {"sensitivity", "largest", "random"}
    firsts = {order: curve[0] for order, curve in run["curves"].items()}
    assert firsts["sensitivity"] == firsts["largest"] == firsts["random"], "k = 0 is the same candidate for all"
    largest = run["curves"]["largest"]
    assert largest[1]["kept_macs_fraction"] >= max(c[1]["kept_macs_fraction"] for c in run["curves"].values())
    assert run["quantized_layers"] > 2 and run["sensitivity_top"][0]["bought_back"] >= \
        run["sensitivity_top"][-1]["bought_back"]
    report = next(tmp_path.glob("int8-sensitivity-tiny-*.md")).read_text()
    assert "Goal (stated before the run)" in report and doc["machine"]["cpu"] in report


def test_the_goal_rule():
    from bench.int8_sensitivity import goal_met

    assert goal_met({"sensitivity": 2, "largest": 4, "random": None}) is True
    assert goal_met({"sensitivity": 3, "largest": 4, "random": 8}) is False
    assert goal_met({"sensitivity": None, "largest": 2, "random": 2}) is False
    assert goal_met({"sensitivity": 0, "largest": 0, "random": 0}) is None, "nothing to regain"

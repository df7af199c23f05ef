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


@pytest.mark.slow
@pytest.mark.parametrize("where", ["first-half", "not-largest"])
def test_the_plant_keeps_the_function_and_goes_where_asked(tiny_run, tmp_path, where):
    """The outlier channel leaves the FP32 network's outputs as they were (ReLU is positively homogeneous); with
    not-largest, its consumer is never the largest layer by MACs, so the largest-layers order cannot find it by size."""
    import shutil

    import numpy as np
    import onnx

    from bench.int8_sensitivity import plant_outlier
    from device.runners.onnxruntime import OnnxRuntimeRunner
    from pipeline.quantize.mixed_precision import layer_macs

    source = tiny_run.manifest.output("export", "student")
    planted_path = tmp_path / "planted.onnx"
    shutil.copy(source, planted_path)
    planted = plant_outlier(planted_path, seed=0, factor=1000.0, where=where)
    macs = layer_macs(onnx.load(str(source)))
    if where == "not-largest":
        assert planted["second"] != max(macs, key=macs.get)
    with OnnxRuntimeRunner(source) as before, OnnxRuntimeRunner(planted_path) as after:
        batch = np.random.default_rng(0).standard_normal((4, *before.input_chw)).astype(np.float32)
        np.testing.assert_allclose(after.infer(batch), before.infer(batch), rtol=1e-3, atol=1e-3)
    assert planted["where"] == where and planted["factor"] == 1000.0

"""The prepared benchmark scripts run end to end here (as plumbing checks; their numbers come from GPUs).

The slowest tests live in ``tests/bench/``, collected first, so that on several pytest-xdist workers the longest
files start first instead of ending the run on one worker.
"""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_dc_baseline_plumbing_on_cpu(repo, tmp_path):
    pytest.importorskip("torchvision")
    result = subprocess.run([sys.executable, "bench/dc_baseline.py", "--allow-cpu", "--sizes", "32", "--precisions",
                             "fp32", "--throughput-batch", "4", "--duration-s", "0.3", "--idle-s", "0",
                             "--out", str(tmp_path)],
                            cwd=repo, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(next(tmp_path.glob("dc-baseline-*.json")).read_text())
    assert [row["batch"] for row in data["rows"]] == [1, 4]
    assert all(row["p50_ms"] > 0 and row["images_per_s"] > 0 for row in data["rows"])
    assert "| 3×32×32 | fp32 | 1 |" in next(tmp_path.glob("dc-baseline-*.md")).read_text()


@pytest.mark.slow  # a Python and torch start
def test_dc_baseline_refuses_to_run_without_a_gpu_unless_asked(repo):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = subprocess.run([sys.executable, "bench/dc_baseline.py"], cwd=repo, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0 and "no CUDA GPU" in result.stderr


def test_benchmark_results_record_no_machine_paths(repo):
    """Results are read on other machines: paths in them are relative to the checkout."""
    for path in (repo / "bench" / "results").iterdir():
        text = path.read_text()
        for prefix in ("/work/", "/root/", "/home/", "/tmp/", str(repo)):
            assert prefix not in text, f"{path.name} records a machine path ({prefix}…)"

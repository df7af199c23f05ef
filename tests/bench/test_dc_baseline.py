"""The prepared benchmark scripts run end to end here (as plumbing checks; their numbers come from GPUs)."""

import importlib.util
import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_dc_baseline_plumbing_on_cpu(repo, tmp_path):
    """The Torch-TensorRT road runs against the STAND-IN (tests/device/torch_tensorrt_standin.py, installed in every
    process by a sitecustomize); TensorRT does not import here, so the ONNX road must say so, not vanish."""
    import os

    from tests.device.torch_tensorrt_standin import sitecustomize_dir

    pytest.importorskip("torchvision")
    _, env = sitecustomize_dir(tmp_path / "site", "2.14.0")
    result = subprocess.run([sys.executable, "bench/dc_baseline.py", "--allow-cpu", "--sizes", "32", "--precisions",
                             "fp32", "--throughput-batch", "4", "--duration-s", "0.3", "--idle-s", "0", "--no-profile",
                             "--arch", "resnet18", "--out", str(tmp_path)],
                            cwd=repo, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(next(tmp_path.glob("dc-baseline-*.json")).read_text())
    assert [(row["road"], row["batch"]) for row in data["rows"]] == [("torch", 1), ("torch", 4),
                                                                     ("torch_tensorrt", 1), ("torch_tensorrt", 4)]
    assert all(row["p50_ms"] > 0 and row["images_per_s"] > 0 for row in data["rows"])
    assert all(row["fallback_ops"] == 1 for row in data["rows"] if row["road"] == "torch_tensorrt")  # the pool
    assert data["roads"]["torch_tensorrt"] == {"measured": True, "version": "2.14.0"}
    assert not data["roads"]["tensorrt"]["measured"] and "tensorrt does not import here" in data["roads"]["tensorrt"][
        "reason"]
    table = next(tmp_path.glob("dc-baseline-*.md")).read_text()
    assert "| Torch | 3×32×32 | fp32 | 1 |" in table and "| Torch-TensorRT | 3×32×32 | fp32 | 1 |" in table
    assert "road tensorrt (ONNX → TensorRT): NOT MEASURED: tensorrt does not import here" in table
    assert "road tensorrt (ONNX → TensorRT): NOT MEASURED" in result.stderr


def test_dc_baseline_names_a_road_that_does_not_import(repo, monkeypatch):
    spec = importlib.util.spec_from_file_location("dc_baseline_bench", repo / "bench" / "dc_baseline.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setitem(sys.modules, "torch_tensorrt", None)  # import raises ImportError
    status = bench.road_status("torch_tensorrt")
    assert status["measured"] is False
    assert "torch_tensorrt does not import here (ModuleNotFoundError" in status["reason"]
    line = bench.road_line("torch_tensorrt", status)
    assert "NOT MEASURED" in line and "WITH_TORCH_TENSORRT=1" in line
    assert bench.road_line("torch", bench.road_status("torch")).startswith("road torch (Torch): measured with torch")


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
    for path in sorted((repo / "bench" / "results").rglob("*")):
        if not path.is_file() or path.suffix == ".png":
            continue
        text = path.read_text()
        for prefix in ("/work/", "/root/", "/home/", "/tmp/", str(repo)):
            assert prefix not in text, f"{path.name} records a machine path ({prefix}…)"

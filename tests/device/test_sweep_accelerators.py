"""A sweep's accelerators in the job process, against the TensorRT stand-in (tests/device/trt_standin.py,
not TensorRT) and without a jtop service, so only the current mode is measured: each accelerator is loaded once,
its windows carry its name, and one the board, TensorRT or runtime cannot give is recorded as not measured with
the reason — never dropped silently. The sweep through the real jtop service is in test_sweep.py."""

import pytest

from device.files import sha256_file
from device.jobs.jobrun import run_job
from device.schema import JobResult, JobSpec
from tests.device import trt_standin
from tests.device.agent_process import tiny_onnx

AGX_ORIN = "Jetson AGX Orin Developer Kit"
ORIN_NANO = "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"
pytest.importorskip("jtop", reason="jetson-stats is in the dev extra (make installs it)")


def _job(model, tmp_path, accelerators, runtime="tensorrt", precision="int8"):
    return {"spec": {"artifact": sha256_file(model), "runtime": runtime, "precision": precision,
                     "batch_sizes": [1, 4], "iterations": 4, "warmup_iterations": 1, "idle_s": 0.0,
                     "telemetry": ["host"], "profile": False,
                     "sweep": {"power_modes": "all", "accelerators": accelerators}},
            "artifact_path": str(model), "engine_cache": str(tmp_path / "engines"),
            "jtop_socket": str(tmp_path / "no-jtop.sock"), "hold_path": str(tmp_path / "hold.json"), "job_id": "j1"}


def _run(model, tmp_path, accelerators, **kw) -> JobResult:
    return JobResult.model_validate(run_job(_job(model, tmp_path, accelerators, **kw), tmp_path))


def test_a_dla_sweep_on_agx_orin_measures_each_accelerator_from_its_own_engines(monkeypatch, tmp_path):
    model = trt_standin.qdq_classifier(tmp_path / "int8.onnx")
    trt_standin.install(monkeypatch, "10.3.0", dla_cores=2, board=AGX_ORIN)
    result = _run(model, tmp_path, ["gpu", "dla0"])
    assert [(run.accelerator, run.batch_size) for run in result.runs] == [("gpu", 1), ("gpu", 4), ("dla0", 1),
                                                                          ("dla0", 4)]
    assert result.sweep.controlled is False and result.sweep.not_measured == []
    # One static engine per batch × accelerator (the DLA ones built for core 0, GPU fallback on).
    builds = sorted(p.read_text() for p in (tmp_path / "engines").rglob("build.json"))
    assert len(builds) == 4 and sum('"dla_core": 0' in b for b in builds) == 2
    assert all("GPU_FALLBACK" in b for b in builds if '"dla_core": 0' in b)
    windows = result.sweep_windows()
    assert [w["accelerator"] for w in windows] == ["gpu", "gpu", "dla0", "dla0"]
    assert result.runtime.device == "gpu", "the first accelerator is the job's runner"


@pytest.mark.parametrize("version, board, cores, said", [
    ("10.3.0", ORIN_NANO, 0, "has 0 DLA core(s)"),
    ("11.3.0", AGX_ORIN, 2, "TensorRT 11.0–11.3 dropped it"),
    ("10.16.0", AGX_ORIN, 2, "10.7 as the last 10.x release with DLA"),
])
def test_a_dla_the_board_or_tensorrt_lacks_is_not_measured_with_the_reason(monkeypatch, tmp_path, version, board,
                                                                           cores, said):
    model = trt_standin.qdq_classifier(tmp_path / "int8.onnx")
    trt_standin.install(monkeypatch, version, dla_cores=cores, board=board)
    result = _run(model, tmp_path, ["gpu", "dla0"])
    assert {run.accelerator for run in result.runs} == {"gpu"}
    (missing,) = result.sweep.not_measured
    assert (missing.accelerator, missing.kind, missing.nvpmodel_name) == ("dla0", "skipped", "every setting")
    assert said in missing.reason and "fix:" in missing.reason


def test_a_dla_point_of_an_onnx_runtime_job_is_not_measured_and_a_dla_first_sweep_fails(monkeypatch, tmp_path):
    """ONNX Runtime would run a "DLA" job on the CPU and call it DLA: refused, with the reason."""
    from device.errors import ConfigError

    model = tiny_onnx(tmp_path / "float.onnx")
    result = _run(model, tmp_path, ["gpu", "dla1"], runtime="onnxruntime", precision="fp32")
    assert {run.accelerator for run in result.runs} == {"gpu"}
    assert "needs the TensorRT runtime; this job runs onnxruntime" in result.sweep.not_measured[0].reason
    with pytest.raises(ConfigError, match="needs the TensorRT runtime"):
        run_job(_job(model, tmp_path, ["dla0"], runtime="onnxruntime", precision="fp32"), tmp_path)


def test_sweep_accelerators_are_validated():
    from pydantic import ValidationError

    base = {"artifact": "a" * 64, "runtime": "tensorrt", "sweep": {"power_modes": "all"}}
    assert JobSpec.model_validate(base).sweep.accelerators == ["gpu"]
    for bad in (["gpu", "gpu"], ["dla"], ["dla2"], []):
        with pytest.raises(ValidationError):
            JobSpec.model_validate({**base, "sweep": {"power_modes": "all", "accelerators": bad}})
    with pytest.raises(ValidationError, match="leave dla_core unset"):
        JobSpec.model_validate({**base, "dla_core": 0, "sweep": {"power_modes": "all", "accelerators": ["dla1"]}})


def test_a_sweep_job_on_its_own_dla_core_stays_there(monkeypatch, tmp_path):
    """dla_core with the sweep's accelerators left at gpu: every window on that core, named so in the front."""
    model = trt_standin.qdq_classifier(tmp_path / "int8.onnx")
    trt_standin.install(monkeypatch, "10.3.0", dla_cores=2, board=AGX_ORIN)
    job = _job(model, tmp_path, ["gpu"])
    job["spec"]["dla_core"] = 1
    result = JobResult.model_validate(run_job(job, tmp_path))
    assert result.runtime.device.startswith("dla:1")
    assert {w["accelerator"] for w in result.sweep_windows()} == {"dla1"}

"""Hand-made but valid agent results (device.schema.JobResult), for report tests that need no agent."""

from __future__ import annotations

from typing import Any

from device.schema import RESULT_SCHEMA, JobResult

SHA = "0" * 64


def run(batch_size: int = 1, p50_ms: float = 2.0, p99_ms: float = 3.0, images_per_s: float = 500.0,
        summary: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"batch_size": batch_size, "iterations": 100, "images": 100 * batch_size, "window_s": 1.0,
            "throughput_images_per_s": images_per_s, "latency_p50_ms": p50_ms, "latency_p90_ms": p99_ms,
            "latency_p99_ms": p99_ms, "latency_mean_ms": p50_ms, "latency_std_ms": 0.1, "latency_cv": 0.05,
            "telemetry": {}, "summary": summary or {}}


def job_result(runtime: str = "tensorrt", precision: str = "int8", runs: list[dict[str, Any]] | None = None,
               profile: dict[str, Any] | None = None, notes: list[str] | None = None,
               **runtime_extra: Any) -> dict[str, Any]:
    """A result document as the agent writes it (validated, so a schema change breaks the tests here)."""
    return JobResult.model_validate({
        "schema": RESULT_SCHEMA, "spec": {"artifact": SHA, "runtime": runtime},
        "input_chw": [3, 16, 16],
        "runtime": {"name": runtime, "precision": precision, "load_s": 0.1, "python": "3.11", **runtime_extra},
        "smoke": {"image": "smoke.png", "output_shape": [1, 10], "top1_index": 0, "preprocess": {}},
        "telemetry_notes": notes or [], "runs": runs or [run()], "profile": profile}).dump()

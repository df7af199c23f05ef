"""The benchmark job a rung becomes on one device: which runtime it gets, its JobSpec, and what identifies the
device. A library: the deploy stage and the latency table's measurements build their jobs here."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from device.errors import ConfigError
from device.schema import (EvaluationSpec, JobSpec, PreprocessSpec, SweepSpec, describe_problems, field_problems,
                           safe_text)
from pipeline.rungs import RUNGS

# What makes two measurements comparable: a change in any of these measures again.
FINGERPRINT_KEYS = ("hostname", "machine", "board", "l4t", "jetpack", "gpu", "compute_capability", "cuda", "tensorrt",
                    "onnxruntime", "torch", "nvpmodel", "jetson_clocks", "edgefold")

def _trt_major(device_info: dict[str, Any]) -> int:
    try:
        return int(str(device_info.get("tensorrt") or "0").split(".")[0] or 0)
    except ValueError:
        return 0


def choose_runtime(requested: str, device_info: dict[str, Any]) -> tuple[str, str | None]:
    """The runtime a device runs the ladder with, and, when ``auto`` could not pick TensorRT, why — in words
    the report prints beside every number that device measured.

    Args:
        requested: ``deploy.runtime`` (``auto``, ``tensorrt`` or ``onnxruntime``).
        device_info: The agent's ``/v1/device`` (``tensorrt``, ``tensorrt_status``).
    """
    if requested != "auto":
        return requested, None
    if _trt_major(device_info) >= 10:  # the engine builder needs TensorRT 10 or newer (JetPack 6.1+)
        return "tensorrt", None
    status = device_info.get("tensorrt_status") or {}
    if device_info.get("tensorrt"):
        why = f"its TensorRT {device_info['tensorrt']} is older than 10 (JetPack 6.1+ ships 10.3)"
    else:
        why = status.get("reason") or "the agent found no TensorRT"
    fix = f" (fix: {status['fix']})" if status.get("fix") else ""
    return "onnxruntime", f"ONNX Runtime ran instead of TensorRT: {why}{fix}"


def sweep_spec(sweep, device_info: dict[str, Any]) -> SweepSpec:
    """The agent's sweep for one device: a Jetson (it reports an L4T) sweeps nvpmodel modes; a GPU server sweeps
    NVML's power limits or locked clocks when the recipe gives them, else its current setting is measured (the agent
    says it has no power-mode control).

    Args:
        sweep: The recipe's ``deploy.sweep`` (:class:`pipeline.recipe.SweepConfig`).
        device_info: The agent's ``/v1/device``.
    """
    common = {"settle_timeout_s": sweep.settle_timeout_s, "accelerators": sweep.job_accelerators()}
    if not device_info.get("l4t") and sweep.power_limits_w is not None:
        return SweepSpec(power_limits_w=sweep.power_limits_w, **common)
    if not device_info.get("l4t") and sweep.gpu_clocks_mhz is not None:
        return SweepSpec(gpu_clocks_mhz=sweep.gpu_clocks_mhz, **common)
    return SweepSpec(power_modes=sweep.modes, jetson_clocks=sweep.jetson_clocks, **common)


def job_spec(rung: str, artifact: str, device_info: dict[str, Any], cfg, preprocess: dict[str, Any],
             label: str, profile: bool = True, evaluation: EvaluationSpec | None = None, sweep=None,
             road: str = "tensorrt") -> JobSpec:
    """The benchmark job for one rung on one device, as the agent's own schema (validated here).

    Args:
        sweep: The recipe's ``deploy.sweep`` (:class:`pipeline.recipe.SweepConfig`), for the ladder's jobs only.
        road: ``tensorrt`` (the ONNX road: ``deploy.runtime`` picks the runtime) or ``torch_tensorrt`` (the rung's
            ``torch.export`` program compiled by Torch-TensorRT on the device; never swept: the sweep is the
            ONNX road's).
    """
    if road == "torch_tensorrt":
        runtime, sweep = "torch_tensorrt", None
    else:
        runtime, _ = choose_runtime(cfg.runtime, device_info)
    # A rung's precision is its artifact's, on every runtime and TensorRT version: an FP32 rung is timed in
    # FP32 and the FP16 question is answered by the FP16 rungs, whose graphs say FP16.
    precision = RUNGS[rung].precision
    try:
        return JobSpec(artifact=artifact, runtime=runtime, precision=precision,
                       batch_sizes=list(sweep.batch_sizes or cfg.batch_sizes) if sweep else list(cfg.batch_sizes),
                       sweep=sweep_spec(sweep, device_info) if sweep else None,
                       duration_s=cfg.duration_s, warmup_iterations=cfg.warmup_iterations, idle_s=cfg.idle_s,
                       min_iterations=cfg.min_iterations, profile=profile, evaluation=evaluation,
                       sample_hz=cfg.sample_hz, threads=cfg.threads, telemetry="auto", timeout_s=cfg.job_timeout_s,
                       preprocess=PreprocessSpec(**preprocess), label=safe_text(label, 200))
    except ValidationError as err:  # the recipe was validated with the same bounds: this is a bug, said plainly
        raise ConfigError(f"deploy: the job for {rung} does not fit the agent's schema: "
                          f"{describe_problems(field_problems(err.errors()))}",
                          fix="check the recipe's deploy section and the export stage's preprocess.json") from None

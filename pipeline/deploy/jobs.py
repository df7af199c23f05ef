"""The benchmark job a rung becomes on one device: which runtime it gets, its JobSpec, what identifies the device,
the agents a deploy measures on and the key of a measured window in the deploy cache. A library: both tasks' deploy
stages and the latency table's measurements build their jobs here."""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pydantic import ValidationError

from device.errors import ConfigError
from device.service.problems import describe_problems, field_problems, safe_text
from device.schema import EvaluationSpec, JobSpec, PreprocessSpec, SweepSpec
from pipeline.core.recipe_jobs import ALL_MODES_BUDGETED
from pipeline.core.manifest import sha256_json
from pipeline.core.rungs import RUNGS
from pipeline.deploy.devices import Device

# What makes two measurements comparable: a change in any of these measures again.
FINGERPRINT_KEYS = ("hostname", "machine", "board", "l4t", "jetpack", "gpu", "compute_capability", "cuda", "tensorrt",
                    "onnxruntime", "torch", "nvpmodel", "jetson_clocks", "edgefold")

LOOPBACK = Device("loopback", "edge", "", "loopback")
"""The device a run measures on when it names none: an agent started for the run on this machine."""


@contextmanager
def deploy_targets(ctx) -> Iterator[tuple[list[Device], Any]]:
    """The devices a deploy stage measures on, and the loopback agent when the run named none.

    Yields:
        ``(devices, loopback)``: the run's devices and None, or ``[LOOPBACK]`` and a started
        :class:`device.service.loopback.LoopbackAgent`, stopped and its store (every uploaded model) removed however the stage
        ends.
    """
    if ctx.devices:
        yield list(ctx.devices), None
        return
    from device.service.loopback import LoopbackAgent

    tmp = tempfile.mkdtemp(prefix="edgefold-loopback-")
    loopback = None
    try:
        # The run's own programs on this machine, under a token of this run: trusted when the recipe sends programs.
        trust = ("--trust-programs",) if getattr(ctx.recipe.deploy, "torch_programs", False) else ()
        loopback = LoopbackAgent(Path(tmp) / "agent", args=trust).start()
        ctx.log(f"[  deploy] no EDGE=/DC=/DEVICES= given: loopback agent at {loopback.url} (this machine)")
        yield [LOOPBACK], loopback
    finally:
        if loopback is not None:
            loopback.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def window_key(*, artifact: str, agent: str, code: str | None, fingerprint: dict[str, Any], round_index: int,
               spec: dict[str, Any]) -> str:
    """The deploy cache's key of one measured window: the artifact, the agent itself (two boards of one kind are
    each measured), the measuring code (a loopback agent runs this checkout's), the device's fingerprint (a new
    TensorRT or power mode measures again), the round and the job."""
    return sha256_json({"artifact": artifact, "agent": agent, "code": code, "fingerprint": fingerprint,
                        "round": round_index, "spec": spec})


def interleaved_rounds(jobs: Sequence[Any], rounds: int, window: Callable[[Any, int], dict[str, Any]],
                       records: dict[Any, list[dict[str, Any]]]) -> None:
    """Every job once per round, in order (teacher, student, INT8, teacher, …): a busy spell hits all of its round's
    jobs and cancels in their paired ratios (:mod:`pipeline.stats`). Stops at a window whose device was lost.

    Args:
        jobs: What is measured in each round, in order (hashable: the keys of ``records``).
        rounds: How many rounds.
        window: Measures (or reuses) one job's window in one round: ``window(job, round_index)``.
        records: Each job's records, filled in place, so what was measured before a device failed is kept.
    """
    for round_index in range(rounds):
        for job in jobs:
            record = window(job, round_index)
            records.setdefault(job, []).append(record)
            if record.get("unreachable"):
                return


def reuse_or_measure(cached: Path, measure: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """One window's record: the deploy cache's, while this version can read its result (a torn or foreign entry, or
    one of another major result version, is measured again, never a crash), else ``measure()``'s, cached when it
    succeeded.

    Returns:
        ``(record, reused)``; a record is ``{"state", "result" (the agent's JSON), …}``.
    """
    from device.files import write_json_atomic
    from device.schema import parse_result

    if cached.is_file():
        try:
            record = json.loads(cached.read_text())
            parse_result(record["result"], str(cached))
            return record, True
        except Exception:  # noqa: BLE001 (whatever is wrong with it, it is measured again)
            cached.unlink(missing_ok=True)
    record = measure()
    if record["state"] == "succeeded":
        write_json_atomic(cached, record, sort_keys=True)
    return record, False


def submit_and_wait(client, path: Path, spec: JobSpec | dict[str, Any], wait_s: float, retries: int,
                    on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One job on an agent, as every task's deploy runs it: the artifact uploaded (the agent keeps one copy), the job
    submitted and waited for, resubmitted up to ``retries`` times when it failed or was interrupted.

    A job still running after ``wait_s`` is cancelled and its rung recorded failed, not retried (a second attempt
    would wait as long), and the device is not lost; a connection that drops is (``unreachable``).

    Returns:
        ``{"state": "succeeded", "job_id", "result" (the agent's JSON), "attempts", "started_at"}``, or
        ``{"state": "failed", "error"}`` with ``"unreachable": True`` where the agent could not be reached.
    """
    from device.client import AgentError, JobTimeoutError

    last_error = None
    for attempt in range(retries + 1):
        try:
            client.upload(path)
            submitted = client.submit(spec)
            job = client.wait(submitted["id"], timeout_s=wait_s, on_progress=on_progress)
        except JobTimeoutError as err:
            return {"state": "failed", "error": f"{err.message}; {client.abandon(err.job_id)}"}
        except AgentError as err:
            if err.status == 0:  # connection lost: the device is gone for this run
                return {"state": "failed", "error": err.message, "unreachable": True}
            last_error = err.message
            continue
        if job["state"] == "succeeded":
            return {"state": "succeeded", "job_id": job["id"], "result": job["result"], "attempts": attempt + 1,
                    "started_at": job.get("started_at")}
        last_error = job["error"]
        if job["state"] not in ("failed", "interrupted"):
            break
    return {"state": "failed", "error": last_error}


def fingerprint(device_info: dict[str, Any]) -> dict[str, Any]:
    """What identifies a device's measuring setup (:data:`FINGERPRINT_KEYS`) from its ``/v1/device``."""
    return {key: device_info.get(key) for key in FINGERPRINT_KEYS}


def trt_major(device_info: dict[str, Any]) -> int:
    """The TensorRT major version a device's ``/v1/device`` reports (0: none, or unreadable)."""
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
    if trt_major(device_info) >= 10:  # the engine builder needs TensorRT 10 or newer (JetPack 6.1+)
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
        sweep: The recipe's ``deploy.sweep`` (:class:`pipeline.core.recipe.SweepConfig`).
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
             road: str = "tensorrt", frame=None, sustained=None) -> JobSpec:
    """The benchmark job for one rung on one device, as the agent's own schema (validated here).

    Args:
        sweep: The recipe's ``deploy.sweep`` (:class:`pipeline.core.recipe.SweepConfig`), for the ladder's jobs only.
        road: ``tensorrt`` (the ONNX road: ``deploy.runtime`` picks the runtime) or ``torch_tensorrt`` (the rung's
            ``torch.export`` program compiled by Torch-TensorRT on the device; never swept: the sweep is the
            ONNX road's).
        frame: The recipe's ``deploy.frame`` (:class:`device.jobs.frame_schema.FrameSpec`), for one round's jobs.
        sustained: The recipe's ``deploy.sustained`` (:class:`pipeline.core.recipe_jobs.SustainedRecipe`): a sustained
            job at its one batch, whose timeout adds its runs' minutes (and cooling) to ``deploy.job_timeout_s`` (the
            build's); with ``sweep`` (its ``swept``), one run per setting on the sweep's first accelerator.
    """
    if road == "torch_tensorrt":
        runtime, sweep = "torch_tensorrt", None
    else:
        runtime, _ = choose_runtime(cfg.runtime, device_info)
    # A rung's precision is its artifact's, on every runtime and TensorRT version: an FP32 rung is timed in
    # FP32 and the FP16 question is answered by the FP16 rungs, whose graphs say FP16.
    precision = RUNGS[rung].precision
    try:
        batch_sizes = list(sweep.batch_sizes or cfg.batch_sizes) if sweep else list(cfg.batch_sizes)
        timeout_s, swept = cfg.job_timeout_s, sweep_spec(sweep, device_info) if sweep else None
        if sustained is not None:
            if swept is not None:  # the board heats under one engine at a time: the first accelerator's
                swept = swept.model_copy(update={"accelerators": swept.accelerators[:1]})
            batch_sizes = [sustained.batch_size]
            # The agent's own count (NVML settles at once); all modes: the most a recipe may name, per jetson_clocks.
            settings, settle_s = (swept.settings(), swept.settle_each_s()) if swept else (1, None)
            settings = settings or ALL_MODES_BUDGETED * len(swept.jetson_clocks or [None])
            timeout_s = cfg.job_timeout_s + sustained.runs_s(settings, settle_s)
            sustained = sustained.job_spec()
        return JobSpec(artifact=artifact, runtime=runtime, precision=precision, batch_sizes=batch_sizes, sweep=swept,
                       duration_s=cfg.duration_s, warmup_iterations=cfg.warmup_iterations, idle_s=cfg.idle_s,
                       min_iterations=cfg.min_iterations, profile=profile, evaluation=evaluation,
                       sample_hz=cfg.sample_hz, threads=cfg.threads, telemetry="auto", timeout_s=timeout_s,
                       preprocess=PreprocessSpec(**preprocess), label=safe_text(label, 200), frame=frame,
                       sustained=sustained)
    except ValidationError as err:  # the recipe was validated with the same bounds: this is a bug, said plainly
        raise ConfigError(f"deploy: the job for {rung} does not fit the agent's schema: "
                          f"{describe_problems(field_problems(err.errors()))}",
                          fix="check the recipe's deploy section and the export stage's preprocess.json") from None

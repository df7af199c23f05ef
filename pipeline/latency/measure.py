"""Latency measurement on an agent: the meter (interleaved windows, a cache written atomically), the job spec
of a table's measurement, and the agent the budget names.

Result documents are read in one place only, :func:`latency_ms`, because the agent's result schema is
being retyped.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from torch import nn

from device.errors import ConfigError, EdgeFoldError, StageError
from device.files import write_json_atomic
from device.schema import parse_result
from pipeline.latency.model import Measurement
from pipeline.core.log import progress_lines
from pipeline.core.manifest import sha256_json

# The one timing cache (a name: the agent keeps the file beside its engines) every latency table's TensorRT
# builds share on a device.
TIMING_CACHE = "latency-table"


def latency_ms(result: dict[str, Any], batch_size: int) -> tuple[float, float, float]:
    """The median latency of one batch size in an agent's job result (device.schema.JobResult), with a
    95% interval for that one window: the standard error of a median is √(π/2)·σ/√n for a normal sample
    (the calls of one window; the table's spread across windows is kept beside it).

    Returns:
        (p50_ms, ci_low_ms, ci_high_ms).

    Raises:
        SchemaVersionError, ResultError: A result of another agent version, or not a result.
        StageError: When the result holds no run of ``batch_size``.
    """
    run = parse_result(result, "the latency table's job result").run(batch_size)
    if run is None:
        raise StageError(f"the agent's result holds no run at batch {batch_size}",
                         fix="this is a bug of the latency table's job spec; report it")
    half = 1.96 * math.sqrt(math.pi / 2) * run.latency_std_ms / math.sqrt(max(run.iterations, 1))
    return run.latency_p50_ms, run.latency_p50_ms - half, run.latency_p50_ms + half



class Meter:
    """Measures models on one agent with the deploy stage's job spec, cached by device, structure and runtime.

    Args:
        client: An open :class:`device.client.AgentClient`.
        spec: The job spec template (:func:`device_spec`); its ``artifact`` is replaced per model.
        key: What identifies the device and its runtime (fingerprint, agent, code of a loopback agent).
        cache: Directory of cached measurements (one JSON file per key).
        workdir: Where the exported models are written.
        windows: Interleaved windows per model.
        opset: ONNX opset of the exports (the export stage's).
    """

    def __init__(self, client, spec, key: dict[str, Any], cache: Path, workdir: Path, windows: int, opset: int,
                 input_shape, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)):
        self.client, self.spec, self.key, self.windows, self.opset = client, spec, key, windows, opset
        self.cache, self.workdir = Path(cache), Path(workdir)
        self.cache.mkdir(parents=True, exist_ok=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.input_shape, self.log = tuple(input_shape), log
        self.jobs = 0
        self.reused = 0

    def _cache_key(self, model: nn.Module) -> str:
        from pipeline.checkpoint import capture_structure

        # The timing cache speeds up builds; it does not change which network is timed, or on what.
        spec = self.spec.model_dump(mode="json", exclude={"label", "artifact", "timing_cache"}, exclude_none=True)
        return sha256_json({"structure": capture_structure(model), "input": list(self.input_shape),
                            "device": self.key, "spec": spec, "windows": self.windows, "opset": self.opset})

    def measure(self, models: dict[Any, nn.Module | Callable[[], nn.Module]],
                refresh: Iterable[Any] = (), fresh: Iterable[Any] = ()) -> dict[Any, Measurement]:
        """Measures every model (cached ones are read back); windows interleave across models, so a slow
        drift of the device spreads over all of them instead of biasing the ones measured last.

        Args:
            models: Models, or builders of them (called one at a time, so that only one is in memory).
            refresh: Names measured again, cache or not, whenever any other model is measured in this call:
                the reference the others are differences against (a table's context) must share their
                session. A context read from the cache had been measured while the host was busy, and a
                whole ResNet-50 table came out as differences against a time 1.7× too long.
            fresh: Names measured in this call whatever the cache holds (a budget's reference and the plan
                compared with it: their ratio must come from one session, never from a cached figure).
        """
        from device.client import AgentError, JobTimeoutError
        from device.schema import JobSpec
        from pipeline.export.onnx import export_onnx

        results: dict[Any, Measurement] = {}
        pending: dict[Any, tuple[str, str]] = {}
        # Tables take minutes: a line with rate and ETA every 15 s.
        progress = progress_lines(len(models), "[   prune] latency: exporting or finding cached", "networks", self.log)
        refresh, fresh = set(refresh), set(fresh)
        for name, model in sorted(models.items(), key=lambda item: item[0] in refresh):  # references last
            progress.update()
            # A builder is called here and its model dropped once exported: a table of a ResNet-50 holds
            # a hundred sub-networks, ~10 GB if built up front.
            model = model if isinstance(model, nn.Module) else model()
            key = self._cache_key(model)
            cached = self._cached(key)
            if cached is not None and name not in fresh and not (name in refresh and pending):
                results[name] = cached
                self.reused += 1
                continue
            if key not in {k for k, _ in pending.values()}:
                path = self.workdir / f"{key[:16]}.onnx"
                if not path.is_file() and self.spec.precision == "int8":  # timed as Q/DQ, as the agent runs it
                    fp32 = path.with_name(f"{path.stem}.fp32.onnx")
                    export_onnx(model, fp32, self.input_shape, self.opset)
                    quantize_for_timing(fp32, path, self.input_shape)
                    fp32.unlink()
                elif not path.is_file():
                    export_onnx(model, path, self.input_shape, self.opset)
                try:
                    artifact = self.client.upload(path)
                except AgentError as err:
                    raise _unreachable(err) from None
                pending[name] = (key, artifact)
            else:
                pending[name] = next(v for v in pending.values() if v[0] == key)
        progress.close()
        unique = {key: artifact for key, artifact in pending.values()}
        windows: dict[str, list[tuple[float, float, float]]] = {key: [] for key in unique}
        if unique:
            self.log(f"[   prune] latency: measuring {len(unique)} networks × {self.windows} windows on the agent")
        progress = progress_lines(len(unique) * self.windows, "[   prune] latency: measuring", "jobs", self.log)
        for _ in range(self.windows):
            submitted: dict[str, str] = {}
            read = 0
            try:
                for key, artifact in unique.items():
                    submitted[key] = self.client.submit(JobSpec.model_validate(
                        {**self.spec.model_dump(exclude_none=True), "artifact": artifact}))["id"]
                for key, job_id in submitted.items():
                    job = self.client.wait(job_id, timeout_s=(self.spec.timeout_s or 1800) + 120, poll_s=0.05)
                    read += 1
                    if job["state"] != "succeeded":
                        raise StageError(f"a latency-table job failed on the agent: {job.get('error')}",
                                         fix="see the agent's log; the deploy stage's runtime must run this model")
                    windows[key].append(latency_ms(job["result"], self.spec.batch_sizes[0]))
                    self.jobs += 1
                    progress.update()
            except JobTimeoutError as err:
                # The agent answers, so it is not "unreachable". The late job and the ones queued after it are
                # cancelled: left there, they would hold the agent's queue after the stage stopped.
                outcome = "; ".join(dict.fromkeys(self.client.abandon(j) for j in list(submitted.values())[read:]))
                raise StageError(f"prune: a latency-table job did not end: {err.message} ({outcome})",
                                 fix=err.fix) from None
            except AgentError as err:
                raise _unreachable(err) from None
            except StageError:
                for job_id in list(submitted.values())[read:]:
                    self.client.abandon(job_id)
                raise
        progress.close()
        for key, values in windows.items():
            ordered = sorted(values, key=lambda v: v[0])
            median = ordered[len(ordered) // 2]
            measurement = Measurement(float(np.median([v[0] for v in values])), (median[1], median[2]),
                                      [v[0] for v in values])
            write_json_atomic(self.cache / f"{key}.json", measurement.to_json())
            for name, (k, _) in pending.items():
                if k == key:
                    results[name] = measurement
        return results

    def _cached(self, key: str) -> Measurement | None:
        """The cached measurement of ``key``; None when there is none or it cannot be read (measured again).

        Entries written before they were written atomically can be truncated by a kill; one bad entry
        must cost one measurement, not every later run.
        """
        path = self.cache / f"{key}.json"
        if not path.is_file():
            return None
        try:
            return Measurement.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as err:
            self.log(f"[   prune] latency: warning: the cached measurement {path} is unreadable "
                     f"({type(err).__name__}: {err}); measuring it again")
            return None


def _unreachable(err) -> StageError:
    return StageError(f"prune: the latency table's agent is unreachable: {err.message}",
                      fix="start the agent (edgefold-agent serve) or pass EDGE=/DC=/DEVICES= for a reachable one; "
                          "with none of them set the loopback agent on this machine is started")


def device_spec(device_info: dict[str, Any], deploy_cfg, target, preprocess: dict[str, Any], label: str):
    """The job spec of a latency-table measurement: the deploy stage's runtime, precision and threads for this
    device (its own :func:`pipeline.deploy.jobs.job_spec`; the deployed rung's, INT8, unless
    ``target.precision`` is ``float``), with the table's batch size and short windows, no idle baseline and
    no telemetry (latency only).

    On TensorRT every table point is an engine build on the device: they all name one timing cache
    (``TIMING_CACHE``), so a build reuses the tactic timings of the layers earlier builds already timed
    (most layers of a sub-network are unchanged from the context's).
    """
    from device.schema import JobSpec
    from pipeline.core.rungs import DEPLOYED
    from pipeline.deploy.jobs import job_spec

    rung = DEPLOYED if target.precision == "deployed" else "student"
    base = job_spec(rung, "0" * 64, device_info, deploy_cfg, preprocess, label)
    return JobSpec.model_validate({**base.model_dump(exclude_none=True), "batch_sizes": [target.batch_size],
                                   "duration_s": target.duration_s, "warmup_iterations": target.warmup_iterations,
                                   "idle_s": 0.0, "telemetry": [],
                                   **({"timing_cache": TIMING_CACHE} if base.runtime == "tensorrt" else {})})


def quantize_for_timing(fp32: Path, out: Path, input_shape) -> Path:
    """An INT8 Q/DQ copy of ``fp32`` whose *speed* is the deployed model's: ONNX Runtime's quantizer with the
    quantize stage's placement (Conv and the residual Add, symmetric, per channel), calibrated on a few
    random images — the scales are wrong for accuracy and irrelevant to latency.

    ModelOpt (the quantize stage's default) places Q/DQ the same way (Conv inputs, one input of each residual
    Add) but takes seconds per network; a table measures a hundred or more.
    """
    from pipeline.quantize.ort import quantize_ort

    calibration = np.random.default_rng(0).standard_normal((8, *input_shape[1:])).astype(np.float32)
    quantize_ort(fp32, out, calibration, "max", per_channel=True)
    return out



@contextlib.contextmanager
def open_agent(devices, name: str, log: Callable[[str], None]) -> Iterator[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """An open client of the agent the latency budget names, its device info, and what identifies it.

    With no devices configured the loopback agent on this machine is started (as the deploy stage does)
    and stopped afterwards.

    Raises:
        ConfigError: When devices are configured and none is called ``name`` (name, group or role).
        StageError: When the agent is unreachable, saying how to make one reachable.
    """
    from device.client import AgentClient, AgentError
    from pipeline.core.codehash import code_sha256
    from pipeline.deploy.jobs import FINGERPRINT_KEYS

    loopback, tmp = None, None
    try:
        if not devices:
            from device.service.loopback import LoopbackAgent

            tmp = tempfile.mkdtemp(prefix="edgefold-latency-")
            try:
                loopback = LoopbackAgent(Path(tmp) / "agent").start()
            except EdgeFoldError as err:
                raise StageError(f"prune: no devices configured and the loopback agent did not start: {err.message}",
                                 fix=f"{err.fix}; or pass EDGE=/DC=/DEVICES= for a reachable agent") from None
            log(f"[   prune] latency: no EDGE=/DC=/DEVICES= given: the budget is measured on the loopback agent "
                f"at {loopback.url} (this machine), not on {name!r}")
            url, token, identity = loopback.url, loopback.token, {"agent": "loopback",
                                                                   "code": code_sha256(("device.jobs.jobrun",
                                                                                        "device.service.agent"))[0]}
        else:
            matches = ([d for d in devices if d.name == name] or [d for d in devices if d.group == name]
                       or [d for d in devices if d.role == name])
            if not matches:
                raise ConfigError(f"prune.latency.device {name!r} is none of the configured devices "
                                  f"({', '.join(d.name for d in devices)})",
                                  fix="name one of them (name, group or role), or pass EDGE=/DC=/DEVICES= with it")
            device = matches[0]
            url, token, identity = device.url, device.token(), {"agent": device.url}
        client = AgentClient(url, token, timeout_s=60)
        try:
            try:
                info = client.device()
            except AgentError as err:
                raise _unreachable(err) from None
            identity["fingerprint"] = {key: info.get(key) for key in FINGERPRINT_KEYS}
            yield client, info, identity
        finally:
            client.close()
    finally:
        if loopback is not None:
            loopback.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


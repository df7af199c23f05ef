"""One benchmark job, run in a child process of the agent: ``python -m device.jobs.jobrun JOB_DIR``, or forked with
this module already imported by ``python -m device.service.zygote`` (:mod:`device.service.launcher`).

The agent writes ``JOB_DIR/job.json`` (the spec, the artifact's path, the agent's telemetry
settings) and waits. This process loads the runner, runs a smoke inference on a real image through
the shared preprocessing, measures every batch size, and writes ``result.json`` — or
``error.json`` (message and fix) and exits 3. A crash, hang or OOM here kills only this process;
the agent records why and moves on. ``progress.json`` tells the agent (and its clients) where it is.

``EDGEFOLD_AGENT_FAULT=LABEL=segv,LABEL=hang`` makes the jobs labelled LABEL crash or hang after
loading: the tests' stand-in for a runtime that segfaults or deadlocks, which cannot be produced on
purpose otherwise. Unset (always, outside tests) it does nothing.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from device.telemetry import contention
from device.errors import ConfigError, DeviceError, EdgeFoldError, MissingDependencyError, NothingMeasuredError
from device.files import write_json_atomic
from device.jobs.measure import MeasureSpec, measure, telemetry_window
from device.power.jtop_client import use_socket
from device.preprocess import Preprocess, read_image
from device.runners import make_runner
from device.reported import reported_fields
from device.schema import RESULT_SCHEMA, JobResult, JobSpec, PowerSetting, RunResult, RunSummary
from device.power.setting_schema import SWEEP_RESTORE_S
from device.jobs.sustain_schema import RESULT_RESERVE_S
from device.jobs.sweep import accelerator_dla_core, open_accelerator, point_facts, run_sweep
from device.telemetry import series
from device.telemetry.base import Sampler, static_facts
from device.telemetry.jtop import shared_client

SMOKE_IMAGE = Path(__file__).parents[1] / "assets" / "smoke.png"
# Which power series is the device's power, in order of preference, and how to name it.
POWER_SOURCES = (("jtop", series.BOARD_POWER), ("nvml", series.GPU_POWER))
MEMORY_SOURCES = (("jtop", series.RAM_USED), ("nvml", series.GPU_MEM_USED), ("host", series.PROCESS_RSS))
SERIES_SOURCES = ("jtop", "nvml", "host")  # a series any of them reads comes from the first


def _is_tegra() -> bool:
    return Path("/etc/nv_tegra_release").exists()


def open_samplers(wanted: list[str] | str, rate_hz: float, jtop_socket: str | None,
                  pci_bus_id: str | None = None) -> tuple[list[Sampler], list[str]]:
    """Opens the requested samplers; with ``auto``, every one this device has (host always).

    Args:
        pci_bus_id: The PCI bus id of the GPU the runner uses: NVML samples that GPU, never index 0 by default.

    Returns:
        (open samplers, notes on those ``auto`` skipped and why).
    """
    from device.telemetry.host import HostSampler
    from device.telemetry.jtop import JtopSampler
    from device.telemetry.nvml import NvmlSampler

    auto = wanted == "auto"
    names = ["jtop", "nvml", "host"] if auto else list(wanted)
    samplers, notes = [], []
    for name in names:
        if name == "jtop":
            use_socket(jtop_socket)
            if auto and not (jtop_socket and os.path.exists(jtop_socket)):
                notes.append(f"jtop: no service socket at {jtop_socket}")
                continue
            sampler = JtopSampler(rate_hz)
        elif name == "nvml":
            if auto and _is_tegra():
                notes.append("nvml: NVML reports no power on Jetson; jtop is used there")
                continue
            sampler = NvmlSampler(rate_hz, pci_bus_id=pci_bus_id)
        else:
            sampler = HostSampler(rate_hz)
        try:
            sampler.open()
        except MissingDependencyError as err:
            if not auto:
                raise
            notes.append(f"{name}: {err.message}")
            continue
        samplers.append(sampler)
    return samplers, notes


def summarize(run: RunResult) -> RunSummary:
    """The headline numbers of one measured batch size, from the best telemetry source present.

    Energy comes with its quality: ``energy_coverage`` (the fraction of the window fresh samples
    cover), ``power_max_gap_s``, ``power_staleness_s``, and ``energy_degraded`` with
    ``energy_degraded_reasons`` ({flag: sentence}) when the window fell short. Every field declared
    with a telemetry series (:func:`device.schema.reported`) is filled from the first source that read it.
    """
    telemetry = run.telemetry
    fields: dict[str, Any] = {}
    for sampler, key in POWER_SOURCES:
        source = telemetry.get(sampler)
        stats = source.series.get(key) if source else None
        if stats and stats.mean is not None and np.isfinite(stats.mean):
            rail = source.facts.get("board_rail")
            fields.update(power_source=f"{sampler}:{rail or key}", power_mean_mw=stats.mean, power_peak_mw=stats.peak,
                          power_idle_mw=stats.idle, energy_mj_per_image=source.energy_mj_per_image,
                          energy_above_idle_mj_per_image=source.energy_above_idle_mj_per_image,
                          energy_method=source.energy_method, energy_coverage=source.coverage,
                          power_max_gap_s=source.max_gap_s, power_staleness_s=source.staleness_s,
                          power_sample_hz=source.achieved_hz, energy_degraded=source.degraded,
                          energy_degraded_reasons=source.degraded_reasons)
            break
    for sampler, key in MEMORY_SOURCES:
        stats = telemetry[sampler].series.get(key) if sampler in telemetry else None
        if stats and stats.peak is not None and np.isfinite(stats.peak):
            fields.update(memory_source=f"{sampler}:{key}", peak_memory_mb=stats.peak)
            break
    for how in reported_fields(RunSummary).values():
        if how.series is None:
            continue
        name = how.path[-1]  # the field itself (the key is the report's column)
        for source in SERIES_SOURCES:
            stats = telemetry[source].series.get(how.series) if source in telemetry else None
            value = getattr(stats, how.stat) if stats else None
            if value is not None and np.isfinite(value):
                fields[name] = value
                break
    return RunSummary(**fields)


def smoke(runner, chw: tuple[int, ...], preprocess: dict[str, Any] | None, finite: bool = True) -> dict[str, Any]:
    """One real photograph through the shared preprocessing and the model: outputs must be finite (``finite``; a debug
    job looks for where they stop being so, and goes on)."""
    if preprocess:
        prep = Preprocess.from_dict(preprocess)
    else:
        channels, size = chw[0], chw[-1]
        prep = Preprocess(input_size=size, resize=size, channels=channels, mean=(0.5,) * channels,
                          std=(0.25,) * channels)
    if tuple(prep.input_shape()[1:]) != tuple(chw):
        raise ConfigError(f"the job's preprocessing gives {prep.input_shape()[1:]} but the model takes {tuple(chw)}",
                          fix="send the preprocessing recorded with this model (manifest: stages.data.metrics)")
    batch = prep(read_image(str(SMOKE_IMAGE)))
    # A runner built for the measured batch sizes only (TensorRT: one engine per batch) takes the image
    # repeated to its smallest batch: batch 1 may lie outside every profile.
    accepted = getattr(runner, "batch_sizes", None)
    if accepted and batch.shape[0] not in accepted:
        batch = np.repeat(batch, min(accepted), axis=0)
    out = np.asarray(runner.infer(batch), dtype=np.float32)
    if finite and not np.all(np.isfinite(out)):
        raise EdgeFoldError("the smoke inference produced NaN or Inf", fix="check the model's export and precision")
    return {"image": SMOKE_IMAGE.name, "output_shape": list(out.shape),
            "top1_index": int(out.reshape(out.shape[0], -1)[0].argmax()), "preprocess": prep.to_dict()}


# Kinds whose loaders make the upload check themselves, just before torch reads the file
# (device.runners.export_load.load_program, device.uploads.torch_checkpoint.read_payload): checked there, not twice.
CHECKED_BY_LOADER = ("torch-export", "torch-checkpoint")


def verify_stored(job: dict[str, Any]) -> None:
    """Each stored file the job names passes its upload check again (:func:`device.uploads.artifacts.verify`), by the kind its
    suffix says the agent stored it as: a file put into the store by other means fails the job here, unread."""
    from device.uploads.artifacts import verify
    from device.service.store import ARTIFACT_SUFFIX

    for key in ("artifact_path", "evaluation_path", "head_path", "frame_model_path", "frame_images_path"):
        path = job.get(key)
        # The longest suffix that fits: an image set's ".images.npy" also ends in an evaluation set's ".npy".
        kind = max((k for k, suffix in ARTIFACT_SUFFIX.items() if path and str(path).endswith(suffix)),
                   key=lambda k: len(ARTIFACT_SUFFIX[k]), default=None)
        if path and kind and (kind not in CHECKED_BY_LOADER
                              or (kind == "torch-export" and not job.get("trust_programs"))):
            verify(path, kind, bool(job.get("trust_programs")))


def run_job(job: dict[str, Any], job_dir: Path) -> dict[str, Any]:
    """Runs one job described by the agent's ``job.json``; returns the result document."""
    spec = JobSpec.model_validate(job["spec"])

    def progress(text: str) -> None:
        write_json_atomic(job_dir / "progress.json", {"progress": text, "at": time.time()})

    progress("loading")
    started = time.perf_counter()
    verify_stored(job)
    # A sweep's first accelerator is the job's runner (smoke, profile, evaluation); the others are loaded beside it.
    # A job's own dla_core (a sweep's accelerators left at gpu) keeps the job on that core, as before 2.3.
    accelerators = list(spec.sweep.accelerators) if spec.sweep is not None and spec.dla_core is None else [None]
    dla_core = spec.dla_core if accelerators[0] is None else accelerator_dla_core(accelerators[0], spec.runtime)

    def make(core: int | None):
        return make_runner(spec.runtime, job["artifact_path"], precision=spec.precision, threads=spec.threads,
                           batch_sizes=spec.batch_sizes, dla_core=core, engine_cache=job.get("engine_cache"),
                           channels_last=spec.channels_last, cuda_graphs=spec.cuda_graphs, timing_cache=spec.timing_cache,
                           marked=spec.marked_tensors(), trust_programs=bool(job.get("trust_programs")))

    runner = make(dla_core)
    faults = dict(item.split("=", 1) for item in os.environ.get("EDGEFOLD_AGENT_FAULT", "").split(",") if "=" in item)
    fault = faults.get(spec.label) if spec.label else None
    with runner, ExitStack() as others:
        load_s = time.perf_counter() - started
        runners = {accelerators[0]: runner}
        skipped = []
        for name in accelerators[1:]:
            progress(f"loading {name}")
            loaded, why = open_accelerator(name, spec.runtime, make)
            if loaded is None:
                skipped.append(why)
                continue
            runners[name] = others.enter_context(loaded)
        planted_fault(fault)
        chw = tuple(runner.input_chw)
        if not chw or any(d is None for d in chw):
            raise ConfigError(f"the model's input has dynamic or unknown dimensions besides the batch: {chw}",
                              fix="export with a fixed C×H×W (only the batch axis dynamic)")
        smoke_result = smoke(runner, chw, spec.preprocess.model_dump() if spec.preprocess else None,
                             finite=spec.diverge is None)
        if spec.diverge is not None or spec.sustained is not None:  # no ladder windows: a job of its own kind
            return (debug_result if spec.diverge else sustained_result)(spec, job, job_dir, runner, chw, smoke_result, load_s)
        sweep = None
        samplers, notes = open_samplers(spec.telemetry, spec.sample_hz, job.get("jtop_socket"),
                                        pci_bus_id=getattr(runner, "pci_bus_id", None))
        try:
            static = static_facts(samplers)
            power_key = next((key for name, key in POWER_SOURCES if any(s.name == name for s in samplers)), None)
            measure_spec = MeasureSpec(warmup_iterations=spec.warmup_iterations, idle_s=spec.idle_s,
                                       min_iterations=spec.min_iterations, **spec.window())

            def measure_point(setting: PowerSetting | None, where: str = "") -> list[RunResult]:
                rng = np.random.default_rng(0)  # every setting times the same batches
                facts = point_facts(static, setting)
                measured = []
                for accelerator, timed in runners.items():
                    on = f"{accelerator}, " if accelerator else ""
                    for index, batch_size in enumerate(spec.batch_sizes, start=1):
                        progress(f"{where + ': ' if where else ''}{on}batch {batch_size} "
                                 f"({index}/{len(spec.batch_sizes)}): measuring")
                        batch = rng.standard_normal((batch_size, *chw)).astype(np.float32)
                        run = measure(timed, batch, measure_spec, samplers, power_key=power_key, facts=facts)
                        run.summary = summarize(run)
                        run.noise_flags = contention.noise_flags(
                            run.contention, run.latency_cv,
                            clocks_dropped=any(t.clocks_dropped for t in run.telemetry.values()),
                            throttled=any(t.temp_limit_crossed or contention.nvml_throttled(t)
                                          for t in run.telemetry.values()))
                        run.power_setting = setting
                        run.accelerator = accelerator
                        measured.append(run)
                return measured

            if spec.sweep is None:
                runs = measure_point(None)
            else:
                runs, sweep = sweep_points(spec, job, job_dir, runner, samplers, measure_point, progress)
                sweep.not_measured = skipped + sweep.not_measured
        finally:
            for sampler in samplers:
                sampler.close()
        # The per-layer profile: a separate pass after the timed windows (profilers slow what they watch).
        from device.jobs.profile import profile_runner

        profile, profile_note = None, "not asked for (JobSpec.profile false)"
        if spec.profile:
            progress("profiling layers")
            profile, profile_note = profile_runner(runner, spec.batch_sizes, chw)
        evaluation, more_evaluations, evaluation_note = None, [], None
        if spec.evaluation is not None:
            engines = timed_engines(runners, spec.batch_sizes)
            scored = []
            for index, (accelerator, timed, batch) in enumerate(engines, start=1):
                on = f"{accelerator}, " if accelerator else ""
                progress(f"evaluating {spec.evaluation.images} images ({on}batch {batch}; engine {index}/"
                         f"{len(engines)})")
                scored.append({**evaluate_engine(spec, job, timed, chw, batch), "accelerator": accelerator})
            evaluation, more_evaluations = scored[0], scored[1:]
            if runner.batch_sizes is None and len(spec.batch_sizes) > 1:
                evaluation_note = (f"one {spec.runtime} model serves every batch size: scored once, at batch "
                                   f"{max(spec.batch_sizes)}")
        frame, frame_error = frame_times(spec, job, runner, progress) if spec.frame is not None else (None, None)
        runtime = {"name": spec.runtime, "precision": ran_precision(runner, spec, job["artifact_path"]),
                   "load_s": load_s, "python": platform.python_version(), "threads": spec.threads}
        if profile_note:
            runtime["profile_note"] = profile_note
        runtime.update(runner.runtime_facts())
    from device.info import describe_device

    # Validated here, by the process that measured: a result the schema refuses fails this job, with the reason.
    return JobResult.model_validate(
        {"schema": RESULT_SCHEMA, "spec": spec.model_dump(), "input_chw": list(chw), "runtime": runtime,
         "smoke": smoke_result, "telemetry_notes": notes, "runs": runs, "profile": profile, "evaluation": evaluation,
         "more_evaluations": more_evaluations, "evaluation_note": evaluation_note,
         "environment": describe_device(), "sweep": sweep, "frame": frame, "frame_error": frame_error}).dump()


def sweep_points(spec: JobSpec, job: dict[str, Any], job_dir: Path, runner, samplers, measure_point, progress):
    """Every setting of the job's sweep measured: NVML's power limits or locked clocks on a data-center GPU, power
    modes through the jtop sampler's client on a Jetson (:func:`device.jobs.sweep.run_sweep`)."""
    job_id, hold = job.get("job_id", job_dir.name), Path(job["hold_path"])
    if spec.sweep.power_modes is None:
        from device.power.gpu_power import run_gpu_sweep

        return run_gpu_sweep(spec.sweep, job_id, hold, getattr(runner, "pci_bus_id", None), measure_point, progress)
    use_socket(job.get("jtop_socket"))
    return run_sweep(spec.sweep, job_id, hold, job.get("nvpmodel_conf"), 1.0 / spec.sample_hz, measure_point,
                     progress, jetson=shared_client(samplers))


def frame_times(spec: JobSpec, job: dict[str, Any], runner, progress) -> tuple[dict[str, Any] | None, str | None]:
    """The frame's path from bytes to the task's answer (the post-processor ``frame.postprocess`` names) on the timed
    runner (:mod:`device.jobs.frame`), after the windows, and on the
    rung with the preprocessing in its graph (``frame.in_graph``, its own runner at the same batch), with one telemetry
    window around the timed rounds; or why it could not be timed: a failure there loses none of what the job measured
    before it (the in-graph form's, none of the CPU path's; the telemetry's, none of the timing)."""
    from device.jobs.frame import frame_batch, load_image_set, time_frames
    from device.scoring.postprocessors import frame_answer

    accepted = getattr(runner, "batch_sizes", None)
    graph_runner, in_graph_error = None, None
    try:
        images = (load_image_set(job["frame_images_path"], spec.frame.images) if spec.frame.images is not None
                  else None)
        k = spec.evaluation.top_k if spec.evaluation else 5
        answer = frame_answer(spec.frame.postprocess, job, spec.evaluation, k)
        with ExitStack() as stack:
            if spec.frame.in_graph is not None:
                progress("frames: loading the rung with the preprocessing in its graph")
                try:
                    # Built as the timed runner was (its accelerator, CUDA graphs, timing cache): one device, two forms.
                    graph_runner = stack.enter_context(make_runner(
                        spec.runtime, job["frame_model_path"], precision=spec.precision, threads=spec.threads,
                        batch_sizes=[frame_batch(accepted)], engine_cache=job.get("engine_cache"),
                        dla_core=getattr(getattr(runner, "options", None), "dla_core", None),
                        cuda_graphs=spec.cuda_graphs, timing_cache=spec.timing_cache))
                except Exception as err:  # noqa: BLE001 (a runtime that cannot build it: the CPU path still timed)
                    in_graph_error = _first_line(err)
            try:
                samplers, notes = open_samplers(spec.telemetry, spec.sample_hz, job.get("jtop_socket"),
                                                pci_bus_id=getattr(runner, "pci_bus_id", None))
            except EdgeFoldError as err:  # a source lost since the windows: the frames are still timed
                samplers, notes = [], [err.message]
            for sampler in samplers:
                stack.callback(sampler.close)
            traces: list = []
            timed = time_frames(runner, Preprocess.from_dict(spec.preprocess.model_dump()), spec.frame, accepted,
                                k=k, progress=progress, graph_runner=graph_runner, images=images, answer=answer,
                                around_rounds=lambda work: traces.extend(telemetry_window(samplers, work)[1]))
        return {**timed, "in_graph_error": in_graph_error or timed.get("in_graph_error"),
                **frame_power(samplers, traces, timed["frames_timed"], notes)}, None
    except Exception as err:  # noqa: BLE001 (OpenCV's cv2.error, a runner's own: said in the result, not fatal)
        return None, _first_line(err)


def frame_power(samplers, traces, frames_timed: int, notes: list[str]) -> dict[str, Any]:
    """The board's power over the frame rounds (clipped to their window, as :func:`summarize`'s energy is) from the
    first power source with a finite mean, the window's energy per frame run in it (the rounds interleave the forms
    and modes, so it is their average, and says so), and the hottest temperature any sampler read inside it; or why
    there is none."""
    from device.telemetry.base import window_energy

    temps = []
    for trace in traces:
        inside = ((trace.times_s >= trace.window[0]) & (trace.times_s <= trace.window[1]) if trace.window is not None
                  else np.ones(len(trace.times_s), bool))
        for key in series.of_kind(trace.values, "temperature"):
            values = trace.values[key]
            # Inside the window; a source slower than the window has only the readings that bracket it.
            values = values[inside] if np.isfinite(values[inside]).any() else values
            if np.isfinite(values).any():
                temps.append(float(np.nanmax(values)))
    for name, key in POWER_SOURCES:
        for sampler, trace in zip(samplers, traces):
            if sampler.name != name or key not in trace.values or trace.window is None:
                continue
            start, stop = trace.window
            mean = window_energy(trace, start, stop, [], power_key=key)["window_power_mw"]
            if mean is None or not np.isfinite(mean):
                continue
            inside = trace.values[key][(trace.times_s >= start) & (trace.times_s <= stop)]
            rail = getattr(sampler, "board_rail", None)
            return {"power": {"source": f"{name}:{rail or key}", "mean_mw": mean,
                              "peak_mw": float(np.nanmax(inside)) if np.isfinite(inside).any() else mean,
                              "window_s": stop - start,
                              "energy_mj_per_frame": mean * (stop - start) / max(frames_timed, 1),
                              "temp_peak_c": max(temps) if temps else None}}
    return {"power_note": "no power telemetry on this device" + (f" ({'; '.join(notes)})" if notes else "")}


def _first_line(err: BaseException) -> str:
    text = str(getattr(err, "message", None) or err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def planted_fault(fault: str | None) -> None:
    """``EDGEFOLD_AGENT_FAULT``'s crash or hang for this job's label (tests only): SIGSEGV, or sleep forever."""
    if fault == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif fault == "hang":
        while True:
            time.sleep(1)


def debug_result(spec: JobSpec, job: dict[str, Any], job_dir: Path, runner, chw: tuple[int, ...],
                 smoke_result: dict[str, Any], load_s: float) -> dict[str, Any]:
    """A debug job's result: its marked tensors kept beside it (:mod:`device.jobs.debug_tensors`), nothing timed."""
    from device.jobs.debug_tensors import run_marked_pass
    from device.info import describe_device

    write_json_atomic(job_dir / "progress.json", {"progress": f"running {spec.diverge.images} images with "
                                                              f"{len(spec.diverge.tensors)} tensors marked",
                                                  "at": time.time()})
    diverge = run_marked_pass(runner, spec, job["evaluation_path"], job_dir, chw)
    return JobResult.model_validate(
        {"schema": RESULT_SCHEMA, "spec": spec.model_dump(), "input_chw": list(chw),
         "runtime": runtime_of(spec, job, runner, load_s), "smoke": smoke_result, "runs": [], "diverge": diverge,
         "environment": describe_device()}).dump()


def runtime_of(spec: JobSpec, job: dict[str, Any], runner, load_s: float) -> dict[str, Any]:
    """What ran a job of its own kind (debug, sustained): the runtime, the precision it ran in, its own facts."""
    return {"name": spec.runtime, "precision": ran_precision(runner, spec, job["artifact_path"]), "load_s": load_s,
            "python": platform.python_version(), "threads": spec.threads, **runner.runtime_facts()}


def sustained_result(spec: JobSpec, job: dict[str, Any], job_dir: Path, runner, chw: tuple[int, ...],
                     smoke_result: dict[str, Any], load_s: float) -> dict[str, Any]:
    """A sustained job's result: the engine run without pause, interval by interval (:mod:`device.jobs.sustain`), under
    the mode found or under each setting of its sweep (one result each, the device restored after), each run ended
    before the job's timeout so that what it recorded is kept."""
    from device.info import describe_device
    from device.jobs.sustain import THERMAL_DIR, run_sustained

    def progress(text: str) -> None:
        write_json_atomic(job_dir / "progress.json", {"progress": text, "at": time.time()})

    # The job's timeout counts from its launch (the agent's monotonic clock, in job.json): what the result (and a
    # sweep's restore) needs is kept back from the last run, so a late build cuts a run short instead of losing it.
    reserve = RESULT_RESERVE_S + (SWEEP_RESTORE_S if spec.sweep is not None else 0.0)
    stop_by = (job["launched_monotonic"] + job["timeout_s"] - reserve
               if job.get("timeout_s") and job.get("launched_monotonic") else None)
    environment = describe_device()  # before the runs: its tools' answers take no time from the result's reserve
    samplers, notes = open_samplers(spec.telemetry, spec.sample_hz, job.get("jtop_socket"),
                                    pci_bus_id=getattr(runner, "pci_bus_id", None))
    try:
        power = next(((name, key) for name, key in POWER_SOURCES if any(s.name == name for s in samplers)), None)

        def run(where: str = "") -> dict[str, Any]:
            return run_sustained(runner, spec.sustained, chw, samplers, power,
                                 thermal_dir=job.get("thermal_dir") or THERMAL_DIR,
                                 margin_c=job.get("thermal_margin_c", 5.0), stop_by=stop_by,
                                 progress=lambda text: progress(f"{where}: {text}" if where else text))

        runs, sweep = (sustained_sweep(spec, job, job_dir, runner, run, stop_by, progress, shared_client(samplers))
                       if spec.sweep is not None
                       else ([run()], None))  # alone, a run with no time for an interval fails the job, saying so
    finally:
        for sampler in samplers:
            sampler.close()
    return JobResult.model_validate(
        {"schema": RESULT_SCHEMA, "spec": spec.model_dump(), "input_chw": list(chw),
         "runtime": runtime_of(spec, job, runner, load_s), "smoke": smoke_result, "telemetry_notes": notes, "runs": [],
         "sustained": runs[0], "more_sustained": runs[1:], "sweep": sweep, "environment": environment}).dump()


def sustained_sweep(spec: JobSpec, job: dict[str, Any], job_dir: Path, runner, run, stop_by: float | None,
                    progress, jetson: Any = None) -> tuple[list[dict[str, Any]], Any]:
    """One sustained run under each setting of the job's sweep (:func:`device.jobs.sweep.run_sweep`, or
    :func:`device.power.gpu_power.run_gpu_sweep` on a data-center GPU): the hold written before the first change, the
    device restored after the last. A setting the timeout leaves no time for is left unset and recorded as not
    measured, as is one whose cooling used up its time. ``jetson``: the job's open jtop client, which the sweep sets
    modes through (None: one of its own).

    Raises:
        ConfigError: A sweep of ``all`` modes whose settings, counted on the board, do not fit the job's timeout
            (before anything is changed).
        DeviceError: No setting's run fitted in the job's timeout (the device restored first).
    """
    from device.schema import NotMeasured
    from device.jobs.sustain import NoIntervalError, SustainedTime

    time_left = SustainedTime(spec.sustained, spec.sustained_settings()[1], job.get("timeout_s"), stop_by)
    cooled_out: list[NotMeasured] = []

    def measure_point(setting: PowerSetting | None, where: str) -> list[dict[str, Any]]:
        try:
            return [{**run(where), "power_setting": setting.model_dump() if setting is not None else None}]
        except NoIntervalError as err:  # its cooling used the time up: the settings before it are kept
            time_left.ran_out = True
            cooled_out.append(NotMeasured(nvpmodel_id=setting.nvpmodel_id if setting else None,
                                          nvpmodel_name=setting.label() if setting else "current mode",
                                          jetson_clocks=setting.jetson_clocks if setting else None, kind="skipped",
                                          reason=err.message))
            return []

    hold, job_id = Path(job["hold_path"]), job.get("job_id", job_dir.name)
    fix = "give the job a longer timeout_s (deploy.job_timeout_s), fewer settings or fewer minutes"
    try:
        if spec.sweep.power_modes is None:  # a data-center GPU: NVML's power limit or locked clocks
            from device.power.gpu_power import run_gpu_sweep

            runs, sweep = run_gpu_sweep(spec.sweep, job_id, hold, getattr(runner, "pci_bus_id", None),
                                        measure_point, progress, budget=time_left)
        else:
            use_socket(job.get("jtop_socket"))
            runs, sweep = run_sweep(spec.sweep, job_id, hold, job.get("nvpmodel_conf"), 1.0 / spec.sample_hz,
                                    measure_point, progress, budget=time_left, jetson=jetson)
    except NothingMeasuredError as err:
        if time_left.ran_out:  # the timeout's doing: with the settings whose cooling used their time up
            raise NothingMeasuredError("; ".join([err.message] + [f"{item.nvpmodel_name}: {item.reason}"
                                                                  for item in cooled_out]), fix=fix) from None
        raise
    if not runs:  # under the current setting only (no power control), and out of time
        raise DeviceError("no sustained run fitted in the job's timeout: "
                          + "; ".join(item.reason for item in cooled_out), fix=fix)
    sweep.not_measured += cooled_out
    return runs, sweep


def timed_engines(runners: dict[str | None, Any], batch_sizes: list[int]) -> list[tuple[str | None, Any, int]]:
    """Every engine a job timed, the one its result's ``evaluation`` scores first: (accelerator, runner, batch).

    A runner that builds one engine per batch (TensorRT, Torch-TensorRT: ``batch_sizes`` set) has one per measured
    batch, each a build of its own that weakly typed TensorRT may give other per-layer precisions; a runner whose one
    model takes any batch (ONNX Runtime, torch) has one. Each sweep accelerator's runner adds its own. The first is
    the first accelerator's largest batch.
    """
    engines = []
    for accelerator, timed in runners.items():
        batches = sorted(set(batch_sizes), reverse=True) if timed.batch_sizes is not None else [max(batch_sizes)]
        engines += [(accelerator, timed, batch) for batch in batches]
    return engines


def evaluate_engine(spec: JobSpec, job: dict[str, Any], runner, chw: tuple[int, ...], batch: int) -> dict[str, Any]:
    """The evaluation set through ``runner``'s engine for ``batch`` and the post-processor the job names
    (:mod:`device.scoring.postprocessors`)."""
    from device.scoring import postprocessors

    return postprocessors.evaluate(spec.evaluation, job, runner, chw, [batch])


def ran_precision(runner, spec: JobSpec, artifact_path: str) -> str:
    """The precision the model actually ran in: TensorRT's as built; otherwise the artifact's own
    (ONNX Runtime runs a Q/DQ model in INT8 and a float model as stored, whatever the job asked);
    torch's as requested (it casts)."""
    built = getattr(runner, "precision_built", None)
    if built:
        return built
    if spec.runtime == "onnxruntime":
        from device.runners.engine import artifact_precision

        try:  # Q/DQ → int8, else its compute layers' weights: an FP16 model keeps float32 I/O
            return artifact_precision(artifact_path)
        except Exception:  # noqa: BLE001 (not an ONNX the lint reads: say what was asked)
            return spec.precision
    return spec.precision


def main(argv: list[str] | None = None) -> int:
    job_dir = Path((argv or sys.argv[1:])[0])
    job = json.loads((job_dir / "job.json").read_text())
    try:
        result = run_job(job, job_dir)
    except EdgeFoldError as err:
        write_json_atomic(job_dir / "error.json", {"message": err.message, "fix": err.fix, "type": type(err).__name__},
                          indent=1)
        return 3
    except Exception as err:  # a runtime's own error (ONNX Runtime, TensorRT, CUDA): the job fails with it
        traceback.print_exc()
        write_json_atomic(job_dir / "error.json", {"message": str(err).strip(), "fix": None, "type": type(err).__name__},
                          indent=1)
        return 4
    write_json_atomic(job_dir / "result.json", result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs the stages of a recipe in order, skipping those whose config and inputs are unchanged."""

from __future__ import annotations

import difflib
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from device import __version__
from device.errors import ConfigError, ManifestError, StageError
from device.registry import Registry
from pipeline import tasks
from pipeline.core import distributed
from pipeline.core.codehash import code_sha256
from pipeline.core.context import RunContext
from pipeline.core.crash import mark
from pipeline.core.log import log
from pipeline.deploy.devices import Device
from device.files import sha256_file
from pipeline.core.manifest import Manifest, sha256_json
from pipeline.core.recipe import load_recipe
from pipeline.core.stage import STAGE_ORDER

LATEST = "latest"


def environment() -> dict[str, Any]:
    """Versions and host facts recorded with every stage."""
    import torch

    env = {"edgefold": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "machine": platform.machine(), "threads": torch.get_num_threads(),
           "cuda": torch.version.cuda if torch.cuda.is_available() else None}
    from importlib import metadata

    # Versions from the installed distributions: a module's own __version__ can lag its release
    # (Torch-Pruning 1.6.1 reports 1.6.0).
    for module, distribution in (("torchvision", "torchvision"), ("torch_pruning", "torch-pruning"),
                                 ("numpy", "numpy"), ("onnxruntime", "onnxruntime"), ("onnx", "onnx"),
                                 ("modelopt", "nvidia-modelopt")):
        try:
            env[module] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            env[module] = None
    env["git"] = _git_commit()
    return env


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def resolve_run_dir(runs_dir: Path, model: str, run_id: str | None, new: bool, absent: Sequence[str] = ()) -> Path:
    """``runs/<model>/<run-id>``: the given id, else the model's latest run, else a new one.

    Reusing the latest run by default is what makes a second ``make edge`` skip its stages. A run that holds stages
    this recipe has no part for (a PyTorch ladder's teacher, where the recipe now starts from an ONNX file) is never
    resumed: its records would be read as this run's, and a new run loses none of them.

    Raises:
        ConfigError: When ``run_id`` names such a run, or is no valid id.
    """
    model_dir = Path(runs_dir) / model
    if run_id:
        if "/" in run_id or run_id in (".", "..", LATEST):
            raise ConfigError(f"invalid run id {run_id!r}", fix="use letters, digits, '-' and '_'")
        held = _held(model_dir / run_id, absent)
        if held:
            raise ConfigError(f"run {model_dir / run_id} holds {', '.join(held)} of a ladder this recipe does not "
                              "run", fix="give another RUN= (--run-id), or NEW=1 (--new)")
        return model_dir / run_id
    latest = model_dir / LATEST
    if not new and latest.is_symlink() and (latest.resolve() / "manifest.json").is_file():
        held = _held(latest.resolve(), absent)
        if not held:
            return model_dir / os.readlink(latest)
        log(f"{latest.resolve()} holds {', '.join(held)}, which this recipe does not run: starting a new run")
    run_id = time.strftime("%Y%m%d-%H%M%S")
    suffix = 1
    while (model_dir / run_id).exists():
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
        suffix += 1
    return model_dir / run_id


def _held(run_dir: Path, stages: Sequence[str]) -> list[str]:
    """Which of ``stages`` a run's manifest records."""
    if not stages or not (run_dir / "manifest.json").is_file():
        return []
    try:
        recorded = Manifest.load(run_dir).data.get("stages", {})
    except ManifestError:
        return []  # reported when the run is opened
    return [name for name in stages if name in recorded]


def _point_latest(run_dir: Path) -> None:
    latest = run_dir.parent / LATEST
    # A symlink, not a file: files.atomic_writer writes bytes, so the link is swapped by os.replace here.
    tmp = run_dir.parent / f".{LATEST}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, latest)


def _stage_names(until: str | None, force: Iterable[str]) -> tuple[list[str], set[str]]:
    for name in [until, *force]:
        if name is not None and name not in STAGE_ORDER:
            near = difflib.get_close_matches(name, STAGE_ORDER, n=1)
            raise ConfigError(f"unknown stage {name!r}", fix=(f"did you mean {near[0]!r}? " if near else "")
                              + f"stages: {', '.join(STAGE_ORDER)}")
    last = STAGE_ORDER.index(until) if until else len(STAGE_ORDER) - 1
    return list(STAGE_ORDER[: last + 1]), set(force)


def stage_code_roots(stage, ctx=None) -> list[str]:
    """The modules whose import closure is a stage's code: its own, the run context it reads data
    through, any it runs without importing (``Stage.code_modules``: the agent's job process) and, given
    the run's context, those its configuration loads by name (``Stage.code_roots``: the prune stage's
    latency path, for a latency budget only)."""
    return [type(stage).__module__, "pipeline.core.context", *stage.code_modules,
            *(stage.code_roots(ctx) if ctx is not None else ())]


def _check_inputs_untouched(name: str, run_dir: Path, input_sha: dict[str, str]) -> None:
    """A stage must never write into an earlier stage's outputs (a quantizer that rewrites the ONNX it
    was given in place): the manifest's hashes would then lie, and what deploy measures would differ
    from what was recorded."""
    for rel, digest in input_sha.items():
        path = run_dir / rel
        if not path.is_file() or sha256_file(path) != digest:
            raise ManifestError(
                f"stage {name} modified its input {rel}, which an earlier stage recorded with sha256 {digest[:12]}…",
                fix=f"this is a bug in stage {name} (it must work on a copy); re-run with --force {rel.split('/')[0]}")


def _stages_for(recipe) -> Registry:
    """The stages of the recipe's task (:mod:`pipeline.tasks`), under the same names for every task."""
    return tasks.get(recipe.task).stages


def _refuse_unbuilt_stage(recipe, name: str, registry: Registry) -> None:
    """Stops a run at the first stage its task does not have: a classification stage would read a detector's
    checkpoint and boxes as a classifier's, and a wrong result is worse than none."""
    if name not in registry:
        built = [n for n in STAGE_ORDER if n in registry]
        missing = [n for n in STAGE_ORDER if n not in registry]
        raise StageError(f"recipe {recipe.name}: the {name} stage is not built for task {recipe.task} yet; built: "
                         f"{', '.join(built)}; not built: {', '.join(missing)}",
                         fix=f"stop before it with --until {built[-1]} (UNTIL={built[-1]}); the results so far are "
                             "recorded in the run's manifest")


def _preflight(recipe, registry: Registry, names: Sequence[str], devices) -> tuple[list[str], list[str]]:
    """Every stage's checks that need no earlier output, before the run directory exists: a refused WEIGHTS or
    runtime leaves nothing behind, not even a 'latest' link pointing at an empty run.

    Returns:
        The stages that take part in this run, and those left out (:meth:`Stage.absent`), each logged with why.
    """
    ctx = RunContext(recipe, None, devices=devices)
    taking_part, absent = [], []
    for name in names:
        stage = registry.get(name) if name in registry else None
        reason = stage.absent(ctx) if stage is not None else None
        if reason:
            log(f"[{name:>8}] not in this run: {reason}")
            absent.append(name)
            continue
        taking_part.append(name)
        if stage is not None:
            stage.preflight(ctx)
    return taking_part, absent


def _say_preprocess_source(recipe) -> None:
    """Logs the preprocessing a recipe left to its teacher's architecture (timm's pretrained_cfg)."""
    if getattr(recipe, "_preprocess_from", None) and getattr(recipe, "preprocess", None) is None:
        log(f"assumed: {recipe._preprocess_from}")  # a detector's ONNX: its layout and letterbox
    elif getattr(recipe, "_preprocess_from", None):
        pre = recipe.preprocess
        log(f"preprocess from {recipe._preprocess_from}: {pre.input_size}×{pre.input_size} (shorter side "
            f"{pre.resize or pre.input_size}, {pre.interpolation}), mean {pre.mean}, std {pre.std}; write a "
            "preprocess section in the recipe to choose otherwise")


def run_pipeline(model: str, *, until: str | None = None, force: Iterable[str] = (), run_id: str | None = None,
                 new: bool = False, overrides: dict[str, Any] | None = None, runs_dir: str | Path = "runs",
                 devices: Sequence[Device] = ()) -> RunContext:
    """Runs (or resumes) a pipeline for ``model``.

    Args:
        model: Recipe name under ``models/`` or a path to a recipe YAML.
        until: Last stage to run (default: all).
        force: Stages to redo even when cached.
        run_id: Run directory name; default the model's latest run, or a new one.
        new: Start a new run instead of resuming the latest.
        overrides: Dotted recipe keys to override (``data.source``, ``teacher.weights``).
        runs_dir: Parent of the run directories.
        devices: Agents to deploy to (none: a loopback agent on this machine).

    Returns:
        The run's context (recipe, manifest, run directory).
    """
    names, forced = _stage_names(until, force)
    me = distributed.init()  # a no-op outside torchrun
    overrides = dict(overrides or {})  # a None is the recipe's null, an empty string an unset flag (load_recipe)
    recipe, recipe_path, recipe_sha = load_recipe(model, overrides)
    registry = _stages_for(recipe)
    names, absent = _preflight(recipe, registry, names, devices)
    # Rank 0 names the run (a new run's id is a timestamp) and owns the manifest; the others follow.
    run_dir = Path(distributed.broadcast_object(
        str(resolve_run_dir(Path(runs_dir), recipe.name, run_id, new, absent)) if me.main else None))
    if me.main:
        # The recipe entry and the overrides are written only when a stage that used them completes:
        # a run that fails before (a wrong DATA=) must not leave a good run's manifest claiming them.
        manifest = Manifest.open(run_dir, recipe.name)
        if not manifest.path.exists():
            manifest.save()
        _point_latest(run_dir)
    distributed.barrier()
    if not me.main:
        manifest = Manifest.load(run_dir)
    ctx = RunContext(recipe, manifest, devices=devices)
    log(f"run {run_dir}" + (f" ({me.size} processes)" if me.distributed else ""))
    _say_preprocess_source(recipe)
    env = None
    for name in names:
        _refuse_unbuilt_stage(recipe, name, registry)
        mark(stage=name)  # what a supervising edgefold names if this process dies of a signal
        stage = registry.get(name)
        needs = stage.needs(ctx)
        for need in needs:
            if not manifest.stage(need):
                raise ManifestError(f"stage {name} needs {need}, which has not run", fix=f"run without --until {need}")
        inputs = {f"{need}.{key}": rel for need in needs for key, rel in manifest.stage(need)["outputs"].items()}
        input_sha = {rel: manifest.stage(rel.split("/")[0])["sha256"][rel] for rel in inputs.values()}
        config = stage.config(ctx)
        # The project code the stage runs (its module and every project module it imports, transitively)
        # is part of its identity: editing train.py or qdq_lint.py redoes exactly the stages that use them.
        code_sha, code_modules = code_sha256(stage_code_roots(stage, ctx))
        config_sha = sha256_json({"config": config, "code_sha256": code_sha})
        prior = manifest.stage(name)
        if (name not in forced and not stage.always_run and prior and prior.get("config_sha256") == config_sha
                and prior.get("input_sha256") == input_sha and manifest.outputs_intact(name)):
            log(f"[{name:>8}] cached ({prior['seconds']:.1f} s saved)  {stage.summary(prior['metrics'])}")
            continue
        workdir = run_dir / name
        # Training state saved after each epoch lives outside the stage's folder, keyed by its config
        # and its inputs: a crashed or killed run resumes there instead of starting the stage over, and
        # changed data or a changed teacher never resumes weights trained on the old ones.
        ctx.resume = run_dir / "resume" / f"{name}-{sha256_json([config_sha, input_sha])[:16]}.pt"
        # The stage writes into a staging folder that replaces its folder only once it succeeded: an
        # interrupted or failed re-run leaves the previous outputs (a 50-minute teacher) intact.
        staging = run_dir / f".{name}.partial"
        if me.main:
            if staging.exists():
                shutil.rmtree(staging)
            staging.mkdir(parents=True)
            log(f"[{name:>8}] running")
        distributed.barrier()
        started = time.perf_counter()
        result = _run_stage(stage, ctx, staging, me)
        seconds = time.perf_counter() - started
        distributed.barrier()
        if me.main:
            _check_inputs_untouched(name, run_dir, input_sha)
            if workdir.exists():
                shutil.rmtree(workdir)
            os.replace(staging, workdir)
            env = env or environment()
            outputs = {key: str((workdir / Path(path).relative_to(staging)).relative_to(run_dir))
                       for key, path in result.outputs.items()}
            manifest.data.update(recipe={"path": str(recipe_path), "sha256": recipe_sha}, overrides=overrides,
                                 task=recipe.task)
            manifest.record(name, {
                "config_sha256": config_sha, "config": config, "code_sha256": code_sha,
                "code_modules": code_modules, "overrides": overrides, "inputs": inputs,
                "input_sha256": input_sha,
                "outputs": outputs, "sha256": {rel: sha256_file(run_dir / rel) for rel in outputs.values()},
                "metrics": result.metrics, "env": {**env, "processes": me.size}, "seconds": round(seconds, 3),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }, order=STAGE_ORDER)
            for stale in ctx.resume.parent.glob(f"{name}-*.pt"):  # this one and those of older configs
                stale.unlink(missing_ok=True)
            log(f"[{name:>8}] done in {seconds:.1f} s  {stage.summary(result.metrics)}")
        distributed.barrier()
        if not me.main:
            manifest = ctx.manifest = Manifest.load(run_dir)
    return ctx


def _run_stage(stage, ctx: RunContext, staging: Path, me: distributed.World):
    """The stage's result on the ranks that run it (None on the others): under torchrun a stage that is not
    ``distributed`` runs on rank 0 alone, as a world of one (no shard, no DDP, no collective to wait on)."""
    if not (stage.distributed or me.main):
        return None
    with distributed.alone(me.distributed and not stage.distributed):
        return stage.run(ctx, staging)


def list_runs(runs_dir: str | Path = "runs", model: str | None = None) -> list[dict[str, Any]]:
    """Every run under ``runs_dir`` (optionally one model's), newest first."""
    rows = []
    for manifest_path in sorted(Path(runs_dir).glob(f"{model or '*'}/*/manifest.json")):
        if manifest_path.parent.is_symlink():
            continue
        try:
            manifest = Manifest.load(manifest_path.parent)
        except ManifestError as err:
            rows.append({"run": str(manifest_path.parent), "error": err.message})
            continue
        stages, task = manifest.data["stages"], tasks.of_manifest(manifest.data)
        score = task.score
        rows.append({
            "run": str(manifest_path.parent), "model": manifest.data["model"], "created": manifest.data.get("created"),
            "stages": [s for s in STAGE_ORDER if s in stages], "score": task.score_name,
            "teacher_score": stages.get("teacher", {}).get("metrics", {}).get(score),
            # An ONNX start has no distill stage: its student (the given graph) is scored at export.
            "student_score": stages.get("distill", {}).get("metrics", {}).get(score)
            or (stages.get("evaluate", {}).get("metrics", {}).get("rungs", {}).get("student") or {}).get(score),
            "seconds": sum(s.get("seconds", 0) for s in stages.values()),
        })
    return sorted(rows, key=lambda r: r.get("created") or "", reverse=True)

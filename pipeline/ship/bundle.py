"""Writes the shipped folder of one rung (``edgefold ship``): everything an application needs to run it as it was
measured, written into a temporary folder and renamed into place at the end (nothing half-written).

::

    <to>/
      model.onnx  labels.txt  preprocess.json  postprocess.json  infer.py  card.md  card.json
      engine/        engine.plan and build.json, when the agent that measured it still holds it
      deepstream/    config_infer.txt, the graph nvinfer runs (and its plan, where the agent timed it), its label
                     file, app.py (the DeepStream Python app)
      triton/        <name>/ (tensorrt_plan, with the engine) and <name>_onnx/ (onnxruntime_onnx)
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from device import pil_resize
from device.errors import ConfigError, EdgeFoldError
from pipeline.ship.card import card_document, card_markdown
from pipeline.ship.choose import DEFAULT_MAX_DROP, TEACHER, choose, pick_device
from pipeline.ship.deepstream import (COLOR_FORMAT, NETWORK_MODE, SCALING_FILTER, config_text, deepstream_model,
                                      normalization)
from pipeline.ship.task import ShipRow, ShipTask
from pipeline.ship.triton import io_facts, write_repository

INFER_SCRIPT = Path(__file__).with_name("infer.py")
DEEPSTREAM_APP = Path(__file__).with_name("deepstream_app.py")  # deepstream/app.py
# The TensorRT a trtexec line is written for when the rung never met one (JetPack 6's, L4T 36.4).
DEFAULT_TENSORRT = "10.3.0"


def ship(run_dir: Path, hooks: ShipTask | None, rung: str = "best", device: str | None = None, to: Path | None = None,
         max_drop: float = DEFAULT_MAX_DROP, in_graph: bool = False, token: str | None = None,
         fetch_engine: bool = True, log: Callable[[str], None] = print, force: bool = False) -> Path:
    """Ships one rung of a finished run into a folder.

    Args:
        run_dir: The run (``runs/<model>/<run-id>``).
        hooks: The run's task's part (``Task.ship``; None: a task that does not ship).
        rung: A rung's name, or ``best`` (:func:`pipeline.ship.choose.choose`).
        device: The device it is shipped for (default: the run's only one).
        to: The folder to write (default: ``<run>/ship/<rung>-<device>``); it must not exist.
        max_drop: ``best``'s allowance, in the task's accuracy points against the teacher.
        in_graph: Also ship the graph with the preprocessing written into it (a run that measured it).
        token: The agent's token, to fetch the engine it built.
        fetch_engine: Ask the agent for the engine (False: ship without it; the card gives its trtexec line).
        force: Ship a rung the report judged unfit (collapsed), named with ``rung``; the card says so.

    Returns:
        The folder written.

    Raises:
        ConfigError: The run is not finished, the rung or device is not there, the folder exists, the device is gone.
    """
    run_dir = Path(run_dir)
    if hooks is None:
        task = _manifest_task(run_dir)
        raise ConfigError(f"{run_dir} is a {task} run, and edgefold ship has no part for the {task} task yet",
                          fix="ship its ONNX by hand from the run's export or quantize folder (manifest.json names "
                              "each rung's file), or ship a classification, detection or segmentation run")
    if not 0 <= max_drop <= 100:  # also NaN
        raise ConfigError(f"--max-drop {max_drop}: the allowance is in accuracy points, from 0 to 100",
                          fix="e.g. --max-drop 1 (MAX_DROP=1): the rung may lose at most 1 point against the teacher")
    _finished(run_dir)
    rows = hooks.rows(run_dir)
    device = pick_device(rows, device)
    row, why = choose(rows, device, rung, max_drop, hooks.metric, force)
    teacher = next((r for r in rows if r.device == device and r.rung == TEACHER), None)
    if row.precision not in NETWORK_MODE:  # what trtexec, nvinfer and the card can each name
        raise ConfigError(f"{row.rung} ran in precision {row.precision!r}, which nvinfer's network-mode has no value "
                          f"for ({', '.join(NETWORK_MODE)})", fix="ship a rung of one of those precisions")
    target = Path(to) if to else run_dir / "ship" / f"{row.rung}-{re.sub(r'[^A-Za-z0-9_.-]', '_', device)}"
    if target.exists():
        raise ConfigError(f"{target} exists", fix="pass another folder with --to (TO=), or remove that one")
    partial = target.parent / f".{target.name}.partial"
    _writable(target, partial)
    log(f"shipping {why}")
    record = deployed_device(run_dir, device)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        _write(hooks, run_dir, row, teacher, why, record, partial, in_graph, token, fetch_engine, log)
        os.replace(partial, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log(f"shipped: {target}")
    return target


def _manifest_task(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / "manifest.json").read_text()).get("task") or "unknown")
    except (OSError, ValueError):
        return "unknown"


def _finished(run_dir: Path) -> None:
    """A run ship can read: it exists and its deploy and report stages ran.

    Raises:
        ConfigError: Which stage is missing, and the command that finishes the run.
    """
    if not (run_dir / "manifest.json").is_file():
        raise ConfigError(f"{run_dir} is not a run (no manifest.json)",
                          fix="name a run folder (runs/<model>/<run-id>) or a model whose latest run finished")
    stages = json.loads((run_dir / "manifest.json").read_text()).get("stages", {})
    missing = [name for name in ("deploy", "report") if name not in stages]
    if missing:
        ran = ", ".join(stages) or "no stage"
        model, run_id = run_dir.resolve().parent.name, run_dir.resolve().name
        finished = sorted((p for p in run_dir.resolve().parent.iterdir() if p.is_dir() and not p.is_symlink()
                           and _has_stages(p, ("deploy", "report"))), key=lambda p: p.name)
        other = f"; or ship its newest finished run: edgefold ship {finished[-1]}" if finished else ""
        raise ConfigError(f"{run_dir} ({run_id}) stopped before {missing[0]} ({ran} ran): ship reads what the device "
                          "measured and the report recorded",
                          fix=f"finish it: edgefold run {model} --run-id {run_id} (make edge MODEL={model} "
                              f"RUN={run_id}){other}")


def _has_stages(run_dir: Path, names: tuple[str, ...]) -> bool:
    try:
        stages = json.loads((run_dir / "manifest.json").read_text()).get("stages", {})
    except (OSError, ValueError):
        return False
    return all(name in stages for name in names)


def _writable(target: Path, partial: Path) -> None:
    """The folder can be written where it is asked for: its parent is a folder, or can be made one, and takes files.

    Raises:
        ConfigError: Why not, with the folder named (nothing is written).
    """
    parent = target.parent
    existing = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"--to {target}: {existing} is a file, not a folder",
                          fix="pass a folder path that does not exist yet (TO=dist/my-model)")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        partial.mkdir()
        partial.rmdir()
    except OSError as err:
        raise ConfigError(f"--to {target}: cannot write there ({err.strerror or err})",
                          fix="pass a folder you can write, e.g. TO=dist/my-model") from None


def deployed_device(run_dir: Path, device: str) -> dict[str, Any]:
    """The deploy stage's record of ``device``: its agent URL and what it said about itself."""
    results = json.loads((run_dir / "deploy" / "results.json").read_text())
    found = next((d for d in results.get("devices", []) if d.get("name") == device), None)
    if found is None:
        raise ConfigError(f"the deploy stage has no record of {device}", fix="deploy to it first (make edge EDGE=URL)")
    return {"url": found.get("url"), "info": found.get("info") or found.get("fingerprint") or {}}


def _write(hooks: ShipTask, run_dir: Path, row: ShipRow, teacher: ShipRow | None, why: str, record: dict[str, Any],
           folder: Path, in_graph: bool, token: str | None, fetch_engine: bool, log) -> None:
    model = folder / "model.onnx"
    shutil.copyfile(hooks.model(run_dir, row.rung), model)
    io = io_facts(model)
    preprocess = shipped_preprocess(hooks.preprocess(run_dir), io["inputs"][0]["name"])
    if in_graph:
        preprocess["in_graph"] = _in_graph(run_dir, row.rung, folder)
    (folder / "preprocess.json").write_text(json.dumps(preprocess, indent=1) + "\n")
    labels = hooks.labels(run_dir)
    (folder / "labels.txt").write_text("\n".join(labels) + "\n")
    # The outputs by the ONNX graph's names and order: a TensorRT engine's tensor order need not keep it.
    postprocess = {**hooks.postprocess(run_dir, row.rung), "outputs": [value["name"] for value in io["outputs"]]}
    (folder / "postprocess.json").write_text(json.dumps(postprocess, indent=1) + "\n")
    extra = hooks.extra_files(run_dir, row.rung, folder)
    shutil.copyfile(INFER_SCRIPT, folder / "infer.py")
    shutil.copyfile(pil_resize.__file__, folder / "pil_resize.py")  # infer.py's antialiased resize, the run's own
    (folder / "requirements.txt").write_text(requirements())
    dla_core = _dla_core(run_dir, row)
    engine = _engine(row, record, folder, io, token, fetch_engine, log, dla_core)
    deepstream = _deepstream(hooks, run_dir, row, folder, preprocess, labels, engine, record, dla_core,
                             (token, fetch_engine, log))
    name = re.sub(r"[^A-Za-z0-9_]", "_", f"{run_dir.parent.name}_{row.rung}")
    onnx_batch = max([row.batch, *row.figures.get("measured_batches", [])])
    triton = write_repository(folder / "triton", name, model, folder / "engine" / engine["file"]
                              if engine.get("file") == "engine.plan" else None, row.batch, max(onnx_batch, 8))
    deployed = json.loads((run_dir / "manifest.json").read_text())["stages"]["deploy"]
    card = card_document(row, teacher, why, hooks.metric, record["info"], deployed.get("finished"), engine,
                         deepstream, {"files": sorted(["model.onnx", "labels.txt", "preprocess.json",
                                                       "postprocess.json", "infer.py", "pil_resize.py", "requirements.txt",
                                                       *extra]),
                                      "triton_models": triton, "run": str(run_dir),
                                      "per_class_drops": hooks.per_class_drops(run_dir, row.rung, row.device),
                                      "power_setting": hooks.power_setting(run_dir, row.rung, row.device)})
    (folder / "card.json").write_text(json.dumps(card, indent=1, default=str) + "\n")
    (folder / "card.md").write_text(card_markdown(card))


def shipped_preprocess(recorded: dict[str, Any], input_name: str) -> dict[str, Any]:
    """``preprocess.json``: every key of the run's record as recorded, and what a consumer needs besides (the input's
    name, type and layout). The channel order is the record's (a model trained on BGR images ships as BGR: infer.py
    flips, nvinfer is told model-color-format=1), never a default written over it."""
    return {**recorded, "input_name": input_name, "dtype": "float32", "layout": "NCHW",
            "channel_order": str(recorded.get("channel_order") or "rgb").lower(), "scale": 1 / 255}


REQUIREMENTS = ("numpy", "onnxruntime", "opencv-python-headless")
"""What ``infer.py`` imports (TensorRT comes with JetPack, not from pip)."""


def requirements(lock: Path = Path(__file__).resolve().parents[2] / "constraints.txt") -> str:
    """``requirements.txt`` for ``infer.py``: its packages at the versions EdgeFold's lock measured with (OpenCV
    below 5 where the lock has none: pip's newest is 5, which the project does not run)."""
    wanted = list(REQUIREMENTS)  # PIL's antialiased resize is pil_resize.py's, beside infer.py: no Pillow needed
    pinned: dict[str, list[str]] = {}
    if lock.is_file():  # the lock's lines as they are, with their Python-version markers
        for line in lock.read_text().splitlines():
            name = line.partition("==")[0].strip().lower()
            if "==" in line and name in wanted:
                pinned.setdefault(name, []).append(line.strip())
    floors = {"opencv-python-headless": "opencv-python-headless<5"}
    lines = [entry for name in wanted for entry in pinned.get(name) or [floors.get(name, name)]]
    return ("# infer.py's packages, at the versions EdgeFold measured with (pip install -r requirements.txt);\n"
            "# on a Jetson, TensorRT comes with JetPack and onnxruntime-gpu from NVIDIA's Jetson wheels.\n"
            + "\n".join(lines) + "\n")


def _in_graph(run_dir: Path, rung: str, folder: Path) -> dict[str, Any]:
    """``model.frame.onnx``: the rung with the preprocessing written into its graph, as the run measured it."""
    results = json.loads((run_dir / "deploy" / "results.json").read_text())
    frame = results.get("frame") or {}
    graph = (frame.get("in_graph") or {}).get(rung)
    if not graph:
        raise ConfigError(f"the run did not measure {rung} with its preprocessing in the graph",
                          fix="deploy with deploy.frame (in_graph: true) first, or ship without --in-graph")
    # By name in the deploy folder: earlier runs recorded the path in the stage's partial folder.
    shutil.copyfile(run_dir / "deploy" / Path(graph).name, folder / "model.frame.onnx")
    return {"file": "model.frame.onnx", "frame": frame.get("recipe") or frame.get("spec"),
            "input": io_facts(folder / "model.frame.onnx")["inputs"][0]}


def trtexec_line(recorded: str | None, io: dict[str, Any], row: ShipRow, info: dict[str, Any],
                 onnx: str = "model.onnx", plan: str = "engine/engine.plan") -> str:
    """The trtexec line that builds ``plan`` from the shipped ``onnx``: the device's own, its paths made the
    folder's; or, for a rung no TensorRT built, the line the agent would run for this batch and precision."""
    if recorded:
        line = re.sub(r"--onnx=\S+", f"--onnx={onnx}", recorded)
        line = re.sub(r"--saveEngine=\S+", f"--saveEngine={plan}", line)
        return re.sub(r"\s--timingCacheFile=\S+", "", line)
    from device.runners.trt_settings import BuildOptions, trtexec_command

    options = BuildOptions(precision=row.precision).for_batch(row.batch)
    chw = tuple(int(d) for d in io["inputs"][0]["dims"])
    return " ".join(trtexec_command(onnx, plan, io["inputs"][0]["name"], chw, options,
                                    info.get("tensorrt") or DEFAULT_TENSORRT, board=info.get("board")))


def _dla_core(run_dir: Path, row: ShipRow) -> int | None:
    """The DLA core the rung ran on (the agent's ``runtime.device``, ``dla:N``), or None (the GPU)."""
    results = json.loads((run_dir / "deploy" / "results.json").read_text())
    device = next((d for d in results.get("devices", []) if d.get("name") == row.device), {})
    runtime = ((device.get("rungs", {}).get(row.rung) or {}).get("result") or {}).get("runtime") or {}
    found = re.fullmatch(r"dla:?(\d+)", str(runtime.get("device") or ""))
    return int(found.group(1)) if found else None


def _engine(row: ShipRow, record: dict[str, Any], folder: Path, io: dict[str, Any], token: str | None,
            fetch_engine: bool, log, dla_core: int | None = None) -> dict[str, Any]:
    """The engine the device built for the shipped batch, with its build, fetched from the agent; or why not."""
    info = record["info"]
    key = row.engines.get(row.batch)
    if row.runtime == "torch_tensorrt":
        # Its engines live inside the compiled program (TensorRT-in-Torch), not as a plan a TensorRT runtime loads.
        return {"file": None, "why": f"the rung ran through Torch-TensorRT on {row.device}, whose engines live inside "
                "its program, not as a TensorRT plan", "trtexec": trtexec_line(None, io, row, info)}
    if record["url"] == "loopback" or row.runtime != "tensorrt" or key is None:
        ran = f"{row.runtime or 'an unknown runtime'} on {row.device}"
        return {"file": None, "why": f"the rung was measured with {ran}, which builds no engine",
                "trtexec": trtexec_line(None, io, row, info)}
    if not fetch_engine:
        return {"file": None, "why": "shipped without it (--no-engine)", "trtexec": trtexec_line(None, io, row, info)}
    fetched = _fetch(record, token, row, key, folder / "engine", None, dla_core, log)
    if isinstance(fetched, str):
        return {"file": None, "why": fetched, "trtexec": trtexec_line(None, io, row, info)}
    build = fetched.pop("build")
    return {**fetched, "trtexec": trtexec_line(build.get("trtexec"), io, row, info)}


def _fetch(record: dict[str, Any], token: str | None, row: ShipRow, key: str, target: Path, name: str | None,
           dla_core: int | None, log) -> dict[str, Any] | str:
    """One engine from the agent's cache into ``target`` (as ``name``, else the agent's file name) with its
    ``build.json``; or why the agent no longer holds it.

    Raises:
        ConfigError: The device does not answer.
    """
    from device.client import AgentClient, AgentError

    try:
        with AgentClient(record["url"], token, timeout_s=60) as client:
            try:
                facts = client.engine(key)
            except AgentError as err:
                if err.status != 404:
                    raise
                log(f"the agent at {record['url']} no longer holds the engine {key}: the card says how to rebuild it")
                return f"the agent no longer holds it ({err.message})"
            target.mkdir(exist_ok=True)
            file = name or facts["file"]
            client.engine_file(key, target / file)
    except (AgentError, EdgeFoldError) as err:
        raise ConfigError(f"the device {row.device} ({record['url']}) does not answer for its engine: "
                          f"{getattr(err, 'message', err)}",
                          fix="bring its agent back, or ship without the engine: --no-engine (the card gives the "
                              "trtexec line that rebuilds it)") from None
    fingerprint = facts["fingerprint"]
    # The build's own record, with what binds the plan: the device it was built on, and its DLA core.
    build = {**(facts["build"] or {}), "fingerprint": fingerprint, "dla_core": dla_core, "agent_key": key,
             "sha256": facts["sha256"],
             "portable": "no: this plan runs only with the TensorRT and on the device (GPU, compute capability, L4T) "
                         "of its fingerprint; it was built neither version- nor hardware-compatible"}
    (target / "build.json").write_text(json.dumps(build, indent=1) + "\n")
    return {"file": file, "sha256": facts["sha256"], "key": key, "fingerprint": fingerprint,
            "fingerprint_text": ", ".join(f"{k} {v}" for k, v in fingerprint.items() if v is not None),
            "tensorrt": (facts["build"] or {}).get("tensorrt"), "build": facts["build"] or {}}


def nvinfer_form(run_dir: Path, row: ShipRow) -> dict[str, Any] | None:
    """The deploy stage's record of the rung's nvinfer graph measured as a form of it (pipeline.deploy.nvinfer_form),
    or None (a run deployed before forms were measured, deploy.nvinfer off, or a graph nvinfer runs unchanged)."""
    results = json.loads((run_dir / "deploy" / "results.json").read_text())
    device = next((d for d in results.get("devices", []) if d.get("name") == row.device), {})
    return (device.get("nvinfer") or {}).get(row.rung)


def _deepstream(hooks: ShipTask, run_dir: Path, row: ShipRow, folder: Path, preprocess: dict[str, Any],
                labels: list[str], engine: dict[str, Any], record: dict[str, Any], dla_core: int | None,
                fetching: tuple[str | None, bool, Callable[[str], None]]) -> dict[str, Any]:
    """``deepstream/``: the config, the graph nvinfer runs and its label file, and the engine the agent built and timed
    for that graph; the accuracy under nvinfer's feed."""
    info = record["info"]
    target = folder / "deepstream"
    target.mkdir()
    scale, offsets, per_channel = normalization(preprocess)
    edits = deepstream_model(folder / "model.onnx", target / "model.onnx", per_channel, hooks.softmax())
    form = nvinfer_form(run_dir, row) if edits["changes"] else None
    if form is not None and form.get("state") == "succeeded":
        # The very file the device measured (deploy/nvinfer-<rung>.onnx), written by the same code from the same rung.
        shutil.copyfile(run_dir / "deploy" / form["file"], target / "model.onnx")
    classifier = hooks.network_type == 1
    notes = []
    if classifier and any(";" in label for label in labels):
        # nvinfer's classifier label file is one line of labels separated by semicolons.
        labels = [label.replace(";", ",") for label in labels]
        notes.append("a ';' in a class name is a ',' in deepstream/labels.txt (nvinfer splits that file on ';')")
    (target / "labels.txt").write_text((";".join(labels) if classifier else "\n".join(labels)) + "\n")
    scaling = preprocess.get("interpolation") if preprocess.get("interpolation") in SCALING_FILTER else "bilinear"
    keys = {"gpu-id": 0, "onnx-file": "model.onnx"}
    build, plan = None, None
    if engine.get("file") == "engine.plan" and not edits["changes"]:
        # The graph nvinfer runs is the one the device built: nvinfer loads that plan when its batch and device fit.
        keys["model-engine-file"] = "../engine/engine.plan"
        plan = {"file": "engine/engine.plan", "sha256": engine.get("sha256"), "key": engine.get("key"),
                "timed": "as the rung itself"}
    else:
        # The graph nvinfer runs differs from the measured rung's: its own plan, the one the agent built and timed
        # for it where it came (below), else built with the measured engine's options by the card's line.
        keys["model-engine-file"] = "model.plan"
        build = trtexec_line(engine.get("trtexec"), io_facts(target / "model.onnx"), row, info,
                             onnx="deepstream/model.onnx", plan="deepstream/model.plan")
        plan = _form_plan(form, row, record, target, dla_core, fetching)
    keys.update({"labelfile-path": "labels.txt", "batch-size": row.batch,
                 "network-mode": NETWORK_MODE[row.precision], "network-type": hooks.network_type,
                 "process-mode": 1, "gie-unique-id": 1,
                 "infer-dims": [preprocess["channels"], preprocess["input_size"], preprocess["input_size"]],
                 "model-color-format": COLOR_FORMAT["bgr" if preprocess.get("channel_order") == "bgr"
                                                    else preprocess["channels"]],
                 "net-scale-factor": f"{scale:.10g}", "offsets": [f"{o:.6g}" for o in offsets],
                 "scaling-filter": SCALING_FILTER[scaling], "maintain-aspect-ratio": 0,
                 **({"enable-dla": 1, "use-dla-core": dla_core} if dla_core is not None else {}),
                 **hooks.nvinfer(run_dir, row.rung)})
    (target / "config_infer.txt").write_text(config_text(keys))
    shutil.copyfile(DEEPSTREAM_APP, target / "app.py")
    scored = hooks.nvinfer_accuracy(run_dir, target / "model.onnx", scaling)
    if scored["value"] is not None:  # what the emulation cannot say: the scaler's own arithmetic on the board
        notes.append(f"On a Jetson nvinfer scales with the VIC (scaling-compute-hw=0, its default), on a GPU with "
                     f"CUDA (1): either filter's rounding can move pixels by a level against OpenCV's {scaling} here, "
                     f"so the board's figure under nvinfer is not measured; where its images can be scored on the "
                     f"board, compare it with this one")
    text = ("not measured" if scored["value"] is None else f"is {100 * scored['value']:.2f}")
    return {"config": "deepstream/config_infer.txt", "accuracy": scored["value"], "accuracy_text": text,
            "host_accuracy": row.host_accuracy, "images": scored["images"], "scaling": scaling,
            "graph_changes": edits["changes"], "engine": keys["model-engine-file"], "trtexec": build,
            "plan": plan, "form": _form_timing(form), "precision": row.precision,
            "notes": [n for n in (scored.get("note"), *notes) if n]}


def _form_plan(form: dict[str, Any] | None, row: ShipRow, record: dict[str, Any], target: Path, dla_core: int | None,
               fetching: tuple[str | None, bool, Callable[[str], None]]) -> dict[str, Any] | None:
    """The engine the agent built and timed for the nvinfer graph, fetched as ``deepstream/model.plan`` with its
    ``build.json``; None where there is none to fetch (the card then says what nvinfer would build)."""
    token, fetch_engine, log = fetching
    key = ((form or {}).get("engines") or {}).get(str(row.batch)) or ((form or {}).get("engines") or {}).get(row.batch)
    if key is None or not fetch_engine or record["url"] == "loopback" or form.get("runtime") != "tensorrt":
        return None
    fetched = _fetch(record, token, row, key, target, "model.plan", dla_core, log)
    if isinstance(fetched, str):
        return None
    return {"file": "deepstream/model.plan", "sha256": fetched["sha256"], "key": key, "timed": "as the rung's form"}


def _form_timing(form: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the card says of the nvinfer graph's time: its p50 and its ratio to the rung's, paired by round."""
    if not form or form.get("state") != "succeeded":
        return None if not form else {"state": form.get("state"), "error": form.get("error")}
    return {"state": "succeeded", "runtime": form.get("runtime"), "batch": form.get("batch"),
            "latency_p50_ms": form.get("latency_p50_ms"), "vs_rung": form.get("vs_rung"),
            "sha256": form.get("sha256")}

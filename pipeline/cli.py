"""The ``edgefold`` command line."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Sequence

from device import __version__
from device.errors import EdgeFoldError

STAGE_HELP = "data, teacher, prune, distill, export, quantize, evaluate, deploy, report"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgefold",
        description="Fold a data-center model into an edge model: prune, distill, quantize to INT8, benchmark on the devices, report.",
    )
    parser.add_argument("--version", action="version", version=f"edgefold {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run (or resume) the pipeline for a model recipe",
                         description="Run the stages of MODEL's recipe into runs/<model>/<run-id>/. Stages whose "
                                     "config and inputs are unchanged are skipped.")
    run.add_argument("model", help="recipe name under models/ (e.g. resnet50, tiny), a path to a recipe YAML, or a "
                                   "trained classifier's .onnx file (the ladder starts at export; --data is needed)")
    run.add_argument("--until", metavar="STAGE", help=f"stop after this stage ({STAGE_HELP})")
    run.add_argument("--force", metavar="STAGE", action="append", default=[], help="redo this stage even if cached (repeatable)")
    run.add_argument("--run-id", help="run directory name (default: the model's latest run, or a new timestamped one)")
    run.add_argument("--new", action="store_true", help="start a new run instead of resuming the latest")
    run.add_argument("--data", help="override data.source: fashion-mnist, digits or imagefolder:/path; for a "
                                       "detection recipe fmnist-det, digits-det or coco:/path/annotations.json")
    run.add_argument("--weights", help="override teacher.weights: a torchvision state_dict path, or 'imagenet'")
    run.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                     help="override any recipe key, e.g. --set teacher.train.epochs=1 (value parsed as YAML)")
    run.add_argument("--runs-dir", default=os.environ.get("EDGEFOLD_RUNS", "runs"), help="parent of run directories (default: runs)")
    run.add_argument("--edge", metavar="URLS", default=os.environ.get("EDGE"),
                     help="edge agents, comma-separated (http://jetson:8765); with no devices a loopback agent is used")
    run.add_argument("--dc", metavar="URLS", default=os.environ.get("DC"), help="data-center agents, comma-separated")
    run.add_argument("--devices", metavar="YAML", default=os.environ.get("DEVICES"),
                     help="devices file with groups (see pipeline/deploy/devices.py)")
    run.add_argument("--token-file", default=os.environ.get("EDGEFOLD_AGENT_TOKEN_FILE"),
                     help="agent token file for --edge/--dc (default: $EDGEFOLD_AGENT_TOKEN)")
    run.add_argument("--diverge", action=argparse.BooleanOptionalAction, default=True,
                     help="when a device's top-1 parts from the host's by more than noise (McNemar), run edgefold "
                          "diverge on that rung and device and put its answer in the report (default: on)")

    report = sub.add_parser("report", help="rebuild a run's report (report.md, report.html, results.json, "
                                           "results.csv) from what its stages recorded")
    report.add_argument("run", help="run directory (runs/<model>/<run-id>) or a model name for its latest run")
    report.add_argument("--runs-dir", default=os.environ.get("EDGEFOLD_RUNS", "runs"))

    sweep = sub.add_parser("sweep", help="sweep a run's rungs over power modes on its Jetsons (deploy and report again)",
                           description="Measure every rung of RUN under each power mode × jetson_clocks × batch size "
                                       "(deploy.sweep) and rebuild its report with the energy–latency front. The "
                                       "earlier stages are reused as they are: the run's recipe and overrides are "
                                       "kept, and a recipe changed since the run is refused.")
    sweep.add_argument("run", help="run directory (runs/<model>/<run-id>) or a model name for its latest run")
    sweep.add_argument("--modes", default="all", help="power modes by name or id, comma-separated (default: all)")
    sweep.add_argument("--jetson-clocks", metavar="on,off", help="jetson_clocks states per mode (default: as found)")
    sweep.add_argument("--accelerators", metavar="gpu,dla", help="where each point runs: gpu, dla (DLA core 0), dla0, "
                                                                 "dla1 (default: gpu)")
    sweep.add_argument("--power-limits-w", metavar="W,W", help="GPU servers: NVML power limits to sweep, W (root)")
    sweep.add_argument("--gpu-clocks-mhz", metavar="MHZ,MHZ", help="GPU servers: graphics clocks to lock, MHz (root)")
    sweep.add_argument("--budget-ms", type=float, help="deploy.latency_budget_ms: the p50 the point to ship must meet")
    sweep.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                       help="another deploy key, e.g. --set deploy.rounds=3 (only deploy.* keys)")
    sweep.add_argument("--runs-dir", default=os.environ.get("EDGEFOLD_RUNS", "runs"))
    _add_devices(sweep)

    _add_sustain(sub)
    _add_diverge(sub)
    _add_ship(sub)

    runs = sub.add_parser("runs", help="list runs with their stages and accuracies")
    runs.add_argument("model", nargs="?", help="only this model's runs")
    runs.add_argument("--runs-dir", default=os.environ.get("EDGEFOLD_RUNS", "runs"))
    runs.add_argument("--json", action="store_true", help="machine-readable output")

    recipes = sub.add_parser("recipes", help="list the recipes under models/")
    recipes.add_argument("--check", action="store_true",
                         help="also validate every recipe, and list the architecture keys with the source of each")

    show = sub.add_parser("recipe", help="validate a recipe and print it with defaults filled in")
    show.add_argument("model", help="recipe name or path")
    show.add_argument("--get", metavar="KEY", help="print one dotted key only (e.g. data.source)")
    return parser


def _add_diverge(sub) -> None:
    from pipeline.deploy.diverge import (DEFAULT_CHUNK, DEFAULT_IMAGES, DEFAULT_MAX_BYTES, MAX_COSINE_DISTANCE,
                                  MAX_RELATIVE_ERROR)

    diverge = sub.add_parser(
        "diverge", help="find the first layer where a device's engine parts from ONNX Runtime (debug jobs, bisection)",
        description="Build RUNG's engine on DEVICE with a few of its tensors marked as outputs, run the first images "
                    "of the run's evaluation set, compare each tensor with ONNX Runtime's on this host, and bisect "
                    "over the graph's order to the first tensor that parts (relative L2 error or cosine distance "
                    "over the thresholds). The answer goes to <run>/diverge/ and into the report.")
    diverge.add_argument("run", help="run directory (runs/<model>/<run-id>) or a model name for its latest run")
    diverge.add_argument("--rung", required=True, help="the rung to look into, e.g. student_int8")
    diverge.add_argument("--device", required=True, help="a device name or agent URL the run deployed to")
    diverge.add_argument("--images", type=int, default=DEFAULT_IMAGES,
                         help=f"evaluation images compared (default: {DEFAULT_IMAGES})")
    diverge.add_argument("--batch", type=int, help="the engine's batch size (default: the largest the rung was "
                                                   "measured at, the engine the deploy stage scored first)")
    diverge.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                         help=f"tensors marked per debug job (default: {DEFAULT_CHUNK}; fewer when --max-mib says so)")
    diverge.add_argument("--max-mib", type=int, default=DEFAULT_MAX_BYTES >> 20,
                         help=f"the most one job may return, MiB (default: {DEFAULT_MAX_BYTES >> 20})")
    diverge.add_argument("--max-relative-error", type=float, default=MAX_RELATIVE_ERROR,
                         help=f"default: {MAX_RELATIVE_ERROR}")
    diverge.add_argument("--max-cosine-distance", type=float, default=MAX_COSINE_DISTANCE,
                         help=f"default: {MAX_COSINE_DISTANCE}")
    diverge.add_argument("--runs-dir", default=os.environ.get("EDGEFOLD_RUNS", "runs"))
    diverge.add_argument("--token-file", default=os.environ.get("EDGEFOLD_AGENT_TOKEN_FILE"),
                         help="agent token file (default: $EDGEFOLD_AGENT_TOKEN)")


def _add_ship(sub) -> None:
    from pipeline.ship.choose import DEFAULT_MAX_DROP

    ship = sub.add_parser(
        "ship", help="write the folder an application runs one rung from (ONNX, engine, DeepStream, Triton, infer.py, "
                     "the card of figures it was chosen on)",
        description="Writes RUN's rung into one folder: model.onnx, labels.txt, preprocess.json, postprocess.json, the "
                    "engine the device built with its build.json (when its agent still holds it), a DeepStream "
                    "nvinfer config, a Triton model repository, infer.py and card.md/card.json. --rung best picks the "
                    "fastest rung on the device within --max-drop points of the teacher's accuracy there.")
    ship.add_argument("run", help="run directory (runs/<model>/<run-id>) or a model name for its latest run; with "
                                  "--check alone, also a folder ship wrote")
    ship.add_argument("--rung", default="best", help="a rung's name, or best (default)")
    ship.add_argument("--device", help="the device it is shipped for (default: the run's only one)")
    ship.add_argument("--to", help="the folder to write (default: <run>/ship/<rung>-<device>); it must not exist")
    ship.add_argument("--max-drop", type=float, default=DEFAULT_MAX_DROP,
                      help=f"--rung best: the most accuracy points a rung may lose against the teacher (default "
                           f"{DEFAULT_MAX_DROP:g}: MLPerf's 99%%-of-FP32 rule at ResNet-50's scale)")
    ship.add_argument("--in-graph", action="store_true",
                      help="also ship model.frame.onnx, the rung with its preprocessing in the graph (deploy.frame)")
    ship.add_argument("--force", action="store_true",
                      help="ship the rung named by --rung even where the report judged it unfit (collapsed, at chance)")
    ship.add_argument("--no-engine", dest="engine", action="store_false",
                      help="do not ask the agent for the engine (the card gives the trtexec line that rebuilds it)")
    ship.add_argument("--check", nargs="?", const="full", choices=("full", "auto", "off"),
                      help="run the folder's infer.py from another directory, in a fresh environment from its "
                           "requirements.txt, on the run's test split: its score must equal the card's; its time per "
                           "image is set against the agent's (auto: only where that takes under a minute; off: none)")
    ship.add_argument("--python", help="--check: run infer.py with this interpreter instead of a fresh environment")
    ship.add_argument("--runs-dir", default=os.environ.get("EDGEFOLD_RUNS", "runs"))
    ship.add_argument("--token-file", default=os.environ.get("EDGEFOLD_AGENT_TOKEN_FILE"),
                      help="agent token file (default: $EDGEFOLD_AGENT_TOKEN)")


def _cmd_ship(args) -> int:
    from pathlib import Path

    from device.client import read_token
    from device.errors import ManifestError
    from pipeline import tasks
    from pipeline.ship.bundle import ship

    from pipeline.ship.check import check, run_of

    args.check = None if args.check == "off" else args.check
    if args.check and (Path(args.run) / "card.json").is_file():  # a folder ship wrote: check it alone
        check(Path(args.run), tasks.of_run(run_of(Path(args.run))).ship, args.check, args.python)
        return 0
    run_dir = _run_dir(args.run, args.runs_dir)
    if not (run_dir / "manifest.json").is_file():
        raise ManifestError(f"no run at {args.run}", fix="pass a run directory (edgefold runs lists them)")
    token = None
    if args.engine and (args.token_file or os.environ.get("EDGEFOLD_AGENT_TOKEN")):
        token = read_token(token_file=args.token_file)
    hooks = tasks.of_run(run_dir).ship
    folder = ship(run_dir, hooks, rung=args.rung, device=args.device, to=Path(args.to) if args.to else None,
                  max_drop=args.max_drop, in_graph=args.in_graph, token=token, fetch_engine=args.engine,
                  force=args.force)
    if args.check:
        check(folder, hooks, args.check, args.python)
    return 0


def _parse_sets(pairs: list[str]) -> dict:
    import yaml

    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise EdgeFoldError(f"--set {pair!r} is not KEY=VALUE", fix="e.g. --set distill.train.epochs=2")
        try:
            overrides[key] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            problem = str(err).splitlines()[0]
            raise EdgeFoldError(f"--set {pair!r}: the value is not valid YAML ({problem})",
                                fix="quote it as a string, or close the bracket: e.g. --set 'key=[0.1, 0.2]'") from None
    return overrides


def _cmd_run(args) -> int:
    from pipeline import tasks
    from pipeline.core import distributed
    from pipeline.deploy.devices import load_devices
    from pipeline.runner import run_pipeline

    flags = {"data.source": args.data, "teacher.weights": args.weights}  # unset flags leave the recipe's value
    overrides = {**{key: value for key, value in flags.items() if value}, **_parse_sets(args.set)}
    devices = load_devices(args.edge, args.dc, args.devices, args.token_file)
    ctx = run_pipeline(args.model, until=args.until, force=args.force, run_id=args.run_id, new=args.new,
                       overrides=overrides, runs_dir=args.runs_dir, devices=devices)
    if not distributed.world().main:  # under torchrun, rank 0 prints the tables
        distributed.shutdown()
        return 0
    if args.diverge:
        _diverge_deviations(ctx, devices)
    tasks.get(ctx.recipe.task).summary(ctx)
    distributed.shutdown()
    _require_an_edge_measurement(ctx)
    return 0


def _diverge_deviations(ctx, devices) -> None:
    """Runs ``edgefold diverge`` for each rung × device whose top-1 the headline says parts from the host's and that
    has no answer yet, then rebuilds the report; a search that fails is logged and leaves the run as it was."""
    from pipeline import tasks
    from pipeline.deploy.diverge import diverge_run
    from pipeline.report.diverge_report import diverge_answers
    from pipeline.report.results import rebuild_report

    if not ctx.manifest.stage("report"):
        return
    headline = json.loads(ctx.manifest.output("report", "json").read_text()).get("headline") or {}
    done = {(a["rung"], a["device"]) for a in diverge_answers(ctx.run_dir)}
    by_name = {device.name: device for device in devices}
    searched = 0
    for deviation in headline.get("device_deviations") or []:
        # "student_int8 (batch 1)": the engine of another batch than the one scored first parted.
        rung, name = deviation["rung"].split(" ")[0], deviation["device"]
        batch = re.search(r"\(batch (\d+)", deviation["rung"])
        if (rung, name) in done or name not in by_name:
            continue
        done.add((rung, name))
        try:
            diverge_run(ctx.run_dir, rung, name, by_name[name].token(), log=ctx.log,
                        inputs=_evaluation_inputs(tasks.of_run(ctx.run_dir)),
                        batch=int(batch.group(1)) if batch else None)
            searched += 1
        except Exception as err:  # noqa: BLE001 (the run and its report stand; the search is an extra)
            ctx.log(f"[ diverge] {rung} on {name}: not searched: {getattr(err, 'message', err)}"
                    + (f" ({err.fix})" if getattr(err, "fix", None) else ""))
    if searched:
        rebuild_report(ctx.run_dir, tasks.of_run(ctx.run_dir).build_report)


def _require_an_edge_measurement(ctx) -> None:
    """Fails the command (after the report is written) when edge devices were named and none measured.

    Raises:
        NoEdgeMeasuredError: Naming each edge URL and why it measured nothing.
    """
    from device.errors import NoEdgeMeasuredError
    from pipeline.deploy.devices import unmeasured_edges

    deployed = ctx.manifest.stage("deploy")
    if not deployed:
        return
    edges = unmeasured_edges(json.loads((ctx.run_dir / deployed["outputs"]["results"]).read_text()))
    if edges:
        named = "; ".join(f"{d['url']} ({d['status']}: {(d.get('error') or 'no rung succeeded').splitlines()[0]})"
                          for d in edges)
        raise NoEdgeMeasuredError(
            f"no edge device measured any rung: {named}",
            fix="start the agent on the device (make agent, or systemctl start edgefold-agent), check the URL and "
                "port with curl URL/v1/health, and the token (TOKEN_FILE=); the report above says what was measured")


def _run_dir(run: str, runs_dir: str):
    from pathlib import Path

    run_dir = Path(run)
    if not (run_dir / "manifest.json").is_file():
        run_dir = Path(runs_dir) / run / "latest"
    return run_dir.resolve()


def _add_sustain(sub) -> None:
    sustain = sub.add_parser("sustain", help="run one rung of a run without pause on its devices (deploy and report "
                                             "again)",
                             description="Run RUN's rung (default: the deployed student) without pause for MINUTES on "
                                         "each device (deploy.sustained), recorded interval by interval, and rebuild "
                                         "the report with \"After N minutes\": burst against settled latency, the "
                                         "first throttle and its cause; with --swept, once under each setting of "
                                         "deploy.sweep. Earlier stages and measured windows are reused; a recipe "
                                         "changed since the run is refused.")
    sustain.add_argument("run", help="run directory (runs/<model>/<run-id>) or a model name for its latest run")
    sustain.add_argument("--minutes", type=float, required=True, help="how long to run without pause")
    sustain.add_argument("--rung", help="the rung to run (default: the deployed student)")
    sustain.add_argument("--batch", type=int, help="its batch (one of deploy.batch_sizes; default 1)")
    sustain.add_argument("--record-every-s", type=float, help="one recorded interval, s (default 10, or a tenth of "
                                                              "a run shorter than 100 s)")
    sustain.add_argument("--swept", action="store_true", help="run under each setting of the run's deploy.sweep, one "
                                                              "result each, the mode found restored after (a sweep "
                                                              "given here with --set deploy.sweep.modes=[...] also "
                                                              "sweeps every rung's ladder windows, which are measured "
                                                              "again)")
    sustain.add_argument("--cool-below-c", type=float, help="before each run, wait idle until every thermal zone is "
                                                            "below this, °C (at most --cool-max-s)")
    sustain.add_argument("--cool-max-s", type=float, help="the longest wait for --cool-below-c, s (default 300)")
    sustain.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                         help="another deploy key, e.g. --set deploy.job_timeout_s=3600 (only deploy.* keys)")
    sustain.add_argument("--runs-dir", default=os.environ.get("EDGEFOLD_RUNS", "runs"))
    _add_devices(sustain)


def _add_devices(parser) -> None:
    for name, env, text in (("--edge", "EDGE", "edge agents, comma-separated"), ("--dc", "DC", "data-center agents"),
                            ("--devices", "DEVICES", "devices file with groups"),
                            ("--token-file", "EDGEFOLD_AGENT_TOKEN_FILE", "agent token file")):
        parser.add_argument(name, default=os.environ.get(env), help=text)


def _cmd_sustain(args) -> int:
    from device.errors import ConfigError

    sustained = {"minutes": args.minutes, **{key: value for key, value in (
        ("rung", args.rung), ("batch_size", args.batch), ("record_every_s", args.record_every_s),
        ("cool_below_c", args.cool_below_c), ("cool_max_s", args.cool_max_s), ("swept", args.swept or None))
        if value is not None}}
    if args.minutes <= 0:
        raise ConfigError(f"--minutes {args.minutes:g}: give a time above 0", fix="--minutes 10")
    if args.record_every_s is None:  # ten intervals at least: a settled third to take an interval over
        sustained["record_every_s"] = max(0.2, min(10.0, args.minutes * 6))
    return _deploy_again(args, "sustain", {"deploy.sustained": sustained})


def _cmd_sweep(args) -> int:
    from device.errors import ConfigError

    clocks = None if args.jetson_clocks is None else [{"on": True, "off": False}.get(v.strip()) for v in
                                                          args.jetson_clocks.split(",")]
    if clocks is not None and None in clocks:
        raise ConfigError(f"--jetson-clocks {args.jetson_clocks!r}: each state is on or off", fix="--jetson-clocks on,off")
    modes = args.modes if args.modes == "all" else [int(m) if m.strip().isdigit() else m.strip()
                                                     for m in args.modes.split(",")]
    sweep = {"modes": modes, "jetson_clocks": clocks}
    for flag, key, kind in (("accelerators", "accelerators", str), ("power_limits_w", "power_limits_w", float),
                            ("gpu_clocks_mhz", "gpu_clocks_mhz", int)):
        given = getattr(args, flag)
        if given is not None:
            try:
                sweep[key] = [kind(value.strip()) for value in given.split(",")]
            except ValueError:
                raise ConfigError(f"--{flag.replace('_', '-')} {given!r}: comma-separated {kind.__name__} values",
                                  fix=f"--{flag.replace('_', '-')} " + {"accelerators": "gpu,dla",
                                                                       "power_limits_w": "150,250",
                                                                       "gpu_clocks_mhz": "990,1410"}[flag]) from None
    return _deploy_again(args, "sweep", {"deploy.sweep": sweep, **({"deploy.latency_budget_ms": args.budget_ms}
                                                                   if args.budget_ms else {})})


def _deploy_again(args, command: str, job: dict) -> int:
    """A finished run deployed and reported again with ``job``'s deploy keys: its recipe and overrides
    kept, its earlier stages and measured windows reused; a recipe changed since the run refused."""
    import hashlib
    from pathlib import Path

    from device.errors import ConfigError, ManifestError
    from pipeline.deploy.devices import load_devices
    from pipeline import tasks
    from pipeline.runner import run_pipeline

    run_dir = _run_dir(args.run, args.runs_dir)
    if not (run_dir / "manifest.json").is_file():
        raise ManifestError(f"no run at {args.run}", fix="pass a run directory (edgefold runs lists them)")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    task = tasks.of_run(run_dir)
    if command not in task.deploys_again:
        built = ", ".join(name for name in tasks.TASK_NAMES if command in tasks.get(name).deploys_again)
        raise ConfigError(f"{run_dir} is a {task.name} run: edgefold {command} is not built for {task.name} runs yet "
                          f"(it is for {built})",
                          fix=f"measure this run at the board's current mode with make edge "
                              f"MODEL={manifest.get('model')} EDGE=…")
    if "quantize" not in manifest.get("stages", {}):
        raise ManifestError(f"{run_dir} has no quantized student yet", fix=f"finish the run first: make edge "
                                                                           f"MODEL={manifest.get('model')}")
    recipe = Path((manifest.get("recipe") or {}).get("path", ""))
    if not recipe.is_file() or hashlib.sha256(recipe.read_bytes()).hexdigest() != manifest["recipe"]["sha256"]:
        raise ConfigError(f"the recipe {recipe} changed (or is gone) since run {run_dir.name}: {command} would "
                          "retrain", fix=f"{command} a run of the current recipe (make edge), or restore the recipe")
    extra = _parse_sets(args.set)
    if any(not key.startswith("deploy.") for key in extra):
        raise ConfigError(f"edgefold {command} sets deploy keys only, not "
                          f"{sorted(k for k in extra if not k.startswith('deploy.'))}",
                          fix="change other stages with edgefold run … --set")
    overrides = {**manifest.get("overrides", {}), **extra, **job}
    ctx = run_pipeline(str(recipe), run_id=run_dir.name, runs_dir=run_dir.parent.parent, overrides=overrides,
                       devices=load_devices(args.edge, args.dc, args.devices, args.token_file))
    print(task.headline(json.loads(ctx.manifest.output("report", "json").read_text())["headline"]))
    print(f"report: {ctx.manifest.output('report', 'html')}")
    _require_an_edge_measurement(ctx)
    return 0


def _cmd_diverge(args) -> int:
    from device.client import read_token
    from device.errors import ManifestError
    from pipeline import tasks
    from pipeline.deploy.diverge import diverge_run
    from pipeline.report.results import rebuild_report

    run_dir = _run_dir(args.run, args.runs_dir)
    if not (run_dir / "manifest.json").is_file():
        raise ManifestError(f"no run at {args.run}", fix="pass a run directory (edgefold runs lists them)")
    for name, value in (("--images", args.images), ("--chunk", args.chunk), ("--max-mib", args.max_mib)):
        if value < 1:
            raise EdgeFoldError(f"{name} {value}: give 1 or more", fix=f"{name} 4")
    task = tasks.of_run(run_dir)
    _, path = diverge_run(run_dir, args.rung, args.device, read_token(token_file=args.token_file),
                          inputs=_evaluation_inputs(task), images=args.images, chunk=args.chunk,
                          max_bytes=args.max_mib << 20,
                          max_relative_error=args.max_relative_error, max_cosine_distance=args.max_cosine_distance,
                          batch=args.batch)
    print(f"answer: {path}")
    if (run_dir / "report").is_dir():
        print(f"report: {rebuild_report(run_dir, task.build_report)['html']}")
    return 0


def _evaluation_inputs(task):
    """The task's test images as its deploy stage sent them (what ``edgefold diverge`` compares on)."""
    return task.stages.get("deploy").hooks.evaluation_inputs


def _cmd_report(args) -> int:
    from pipeline import tasks
    from pipeline.report.results import rebuild_report

    run_dir = _run_dir(args.run, args.runs_dir)
    task = tasks.of_run(run_dir)
    paths = rebuild_report(run_dir, task.build_report)
    print(task.headline(json.loads(paths["json"].read_text())["headline"]))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def _cmd_runs(args) -> int:
    from pipeline.runner import list_runs

    rows = list_runs(args.runs_dir, args.model)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no runs under {args.runs_dir}/")
        return 0
    pct = lambda v: f"{100 * v:.2f}%" if isinstance(v, float) else "-"  # noqa: E731
    from pipeline.core.stage import STAGE_ORDER

    width = max(len(row["run"]) for row in rows) + 2
    print(f"{'run':<{width}}{'last stage':<16}{'score':>7}{'teacher':>9}{'student':>9}{'seconds':>9}")
    for row in rows:
        if "error" in row:
            print(f"{row['run']:<{width}}error: {row['error']}")
            continue
        last = f"{row['stages'][-1]} ({len(row['stages'])}/{len(STAGE_ORDER)})" if row["stages"] else "-"
        print(f"{row['run']:<{width}}{last:<16}{row['score']:>7}{pct(row['teacher_score']):>9}"
              f"{pct(row['student_score']):>9}{row['seconds']:>9.0f}")
    return 0


def _cmd_recipes(args) -> int:
    from pipeline.core.recipe import available_recipes, load_recipe, recipes_dir

    failures = 0
    for name in available_recipes():
        if args.check:
            try:
                recipe, _, _ = load_recipe(name)
                print(f"{name:<20} ok   {recipe.description}")
            except EdgeFoldError as err:
                failures += 1
                print(f"{name:<20} FAIL {err.message}")
        else:
            print(name)
    if not available_recipes():
        print(f"no recipes in {recipes_dir()}", file=sys.stderr)
    if args.check:
        failures += _print_architectures()
    return 1 if failures else 0


def _print_architectures() -> int:
    """The architecture keys recipes may name and where each comes from; 1 when a source is refused (two packages
    registering one key, an entry point that fails to load)."""
    import importlib.util

    from device.models.architectures import ARCHITECTURES

    try:
        names = ARCHITECTURES.names()
    except EdgeFoldError as err:
        print(f"\narchitectures: FAIL {err.message}\n  fix: {err.fix}")
        return 1
    print("\narchitectures (teacher.arch, distill.student):")
    for name in names:
        print(f"  {name:<24} {ARCHITECTURES.source(name)}")
    if importlib.util.find_spec("timm") is not None:
        import timm

        print(f"  {'timm/<name>':<24} timm {timm.__version__} ({len(timm.list_models())} architectures)")
    else:
        from device.models.timm_architectures import INSTALL

        print(f"  {'timm/<name>':<24} unavailable: timm is not installed ({INSTALL})")
    return 0


def _cmd_recipe(args) -> int:
    import yaml

    from pipeline.core.recipe import load_recipe

    recipe, path, sha = load_recipe(args.model)
    data = recipe.model_dump(mode="json")
    if args.get:
        for key in args.get.split("."):
            if not isinstance(data, dict) or key not in data:
                raise EdgeFoldError(f"recipe has no key {args.get!r}", fix="see `edgefold recipe MODEL` for the keys")
            data = data[key]
        print(data if not isinstance(data, (dict, list)) else json.dumps(data))
        return 0
    print(f"# {path} (sha256 {sha[:12]})")
    print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


def console(argv: Sequence[str] | None = None) -> int:
    """The ``edgefold`` console script: ``run`` in a supervised child process (a native crash — a segfault inside
    PyTorch — then ends with the stage, the step and the setting to change, not a bare exit 139; pipeline.core.crash),
    every other command in this one. ``python -m pipeline`` (the child, and torchrun's ranks) runs :func:`main`."""
    import os

    from pipeline.core.crash import BREADCRUMB_ENV, supervised

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"] and BREADCRUMB_ENV not in os.environ and os.environ.get("EDGEFOLD_SUPERVISE", "1") != "0":
        return supervised(argv)
    return main(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``edgefold`` console script."""
    args = _parser().parse_args(argv)
    commands = {"run": _cmd_run, "runs": _cmd_runs, "recipes": _cmd_recipes, "recipe": _cmd_recipe,
                "report": _cmd_report, "sweep": _cmd_sweep, "sustain": _cmd_sustain,
                "diverge": _cmd_diverge, "ship": _cmd_ship}
    try:
        return commands[args.command](args)
    except EdgeFoldError as err:
        print(f"error: {err.message}", file=sys.stderr)
        if err.fix:
            print(f"  fix: {as_typed(err.fix)}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted; completed stages are kept and will be skipped next time", file=sys.stderr)
        return 130


def as_typed(fix: str) -> str:
    """A fix as the user can type it where they are: make's ``SET='a=1 b=2'`` under make (GNU make exports
    ``MAKELEVEL`` to what it runs), else ``edgefold run``'s one ``--set`` per key."""
    import os

    if "MAKELEVEL" in os.environ:
        return fix
    return re.sub(r"SET='([^']*)'", lambda m: " ".join(f"--set '{pair}'" for pair in _pairs(m.group(1))), fix)


def _pairs(text: str) -> list[str]:
    """``a=1 b=[2, 3]`` → ``["a=1", "b=[2, 3]"]``: split on spaces outside brackets."""
    pairs, depth, current = [], 0, ""
    for char in text:
        depth += 1 if char in "[{(" else -1 if char in "]})" else 0
        if char == " " and depth == 0:
            if current:
                pairs.append(current)
            current = ""
            continue
        current += char
    return pairs + ([current] if current else [])


if __name__ == "__main__":
    sys.exit(main())

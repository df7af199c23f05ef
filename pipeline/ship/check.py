"""``edgefold ship --check``: a shipped folder run the way an application engineer first runs it — ``infer.py`` from
another directory, in a fresh virtual environment made from the folder's own ``requirements.txt`` — on the run's test
split, its score set against the card's and its time per image against the agent's.

The score must be equal: the same graph on the same runtime answers the same. Where ``infer.py`` ran the shipped
engine (TensorRT, on the device) the card's device figure is the one to equal; where it ran ONNX Runtime it is the
figure ONNX Runtime gave (the device's where the agent measured with ONNX Runtime, else the host's). The time is a
ratio, printed and written to the card, never a gate: the two were taken on different machines or under different
loads as often as not.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from device.errors import ConfigError, EdgeFoldError
from pipeline.ship.card import card_markdown, check_text

AUTO_BUDGET_S = 60.0
"""``--check auto`` (``make ship``): the whole check only where it is expected to take under this."""
PROBE_IMAGES = 8
"""Images ``auto`` times first, to project the whole split's time."""


class CheckFailed(EdgeFoldError):
    """The shipped folder does not do what its card says."""


def run_of(folder: Path) -> Path:
    """The run a shipped folder came from, as its card names it.

    Raises:
        ConfigError: The folder is not a shipped one, or its run has moved.
    """
    card_path = Path(folder) / "card.json"
    if not card_path.is_file():
        raise ConfigError(f"{folder} is not a folder edgefold ship wrote (no card.json)",
                          fix="pass the folder make ship printed (shipped: …), or a run to ship and check")
    run = Path(json.loads(card_path.read_text())["run"])
    if not (run / "manifest.json").is_file():
        raise ConfigError(f"{folder}'s run {run} is not there any more: the check scores the run's test split",
                          fix="check it where the run is, or ship the run again")
    return run


def fresh_python(requirements: Path, workdir: Path, log: Callable[[str], None]) -> Path:
    """A new virtual environment under ``workdir`` with ``requirements`` installed; its interpreter.

    Raises:
        ConfigError: pip could not install them, with pip's last words.
    """
    started = time.perf_counter()
    venv = workdir / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
    python = venv / ("Scripts/python.exe" if platform.system() == "Windows" else "bin/python")
    installed = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r",
                                str(requirements)], capture_output=True, text=True)
    if installed.returncode != 0:
        said = (installed.stderr or installed.stdout).strip().splitlines()[-3:]
        raise ConfigError(f"pip could not install {requirements} into a fresh environment: {' '.join(said)}",
                          fix="check the network or pip's index, or run the check with an interpreter that has "
                              "them: --python PATH")
    log(f"check: a fresh environment from requirements.txt in {time.perf_counter() - started:.0f} s")
    return python


def _infer(python: Path, folder: Path, images: Path, workdir: Path, limit: int | None = None) -> dict[str, Any]:
    """``infer.py`` on ``images`` (the first ``limit`` of them), run from ``workdir``: its answers and stats."""
    if limit is not None:
        chosen = workdir / f"probe-{limit}"
        chosen.mkdir(exist_ok=True)
        for path in sorted(images.iterdir())[:limit]:
            shutil.copyfile(path, chosen / path.name)
        images = chosen
    answers, stats = workdir / "answers.json", workdir / "stats.json"
    started = time.perf_counter()
    result = subprocess.run([str(python), str(folder.resolve() / "infer.py"), str(images), "--json", str(answers),
                             "--stats", str(stats), *(["--masks", str(workdir / "masks")]
                                                      if (json.loads((folder / "postprocess.json").read_text())
                                                          ["kind"] == "segmentation") else [])],
                            cwd=workdir, capture_output=True, text=True)
    if result.returncode != 0:
        raise CheckFailed(f"infer.py failed on the test images: {result.stderr.strip()[-600:]}",
                          fix="run it by hand as the card shows to see why; report it to EdgeFold if the folder is "
                              "as shipped")
    return {"answers": json.loads(answers.read_text()), "stats": json.loads(stats.read_text()),
            "wall_s": time.perf_counter() - started}


def reference(card: dict[str, Any], runtime: str) -> tuple[float | None, str]:
    """The card's figure ``infer.py``'s score must equal, for the runtime it ran, and what that figure is."""
    figures, under = card["figures"], card["measured_under"]
    if runtime.startswith("TensorRT") or under.get("runtime") == "onnxruntime":
        source = "the device's" if figures.get("accuracy_source") == "device" else "the host's"
        return figures.get("accuracy"), f"{source} score of this rung on the card ({under.get('runtime')})"
    host = (card.get("deepstream") or {}).get("host_accuracy")
    return host, "the host's ONNX Runtime score of this rung (the card's device ran TensorRT, which infer.py " \
                 "did not find here)"


def check(folder: Path, hooks, mode: str = "full", python: str | None = None,
          log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Checks a shipped folder (see the module's docstring) and writes the result into its card.

    Args:
        folder: What ``edgefold ship`` wrote.
        hooks: The run's task's :class:`pipeline.ship.task.ShipTask`.
        mode: ``full``, or ``auto`` (only where it projects under :data:`AUTO_BUDGET_S`; else it says the command).
        python: Run ``infer.py`` with this interpreter instead of a fresh environment (a Jetson's own Python, with
            JetPack's TensorRT).

    Returns:
        The check's record, or None where ``auto`` left it to the user.

    Raises:
        CheckFailed: The score differs from the card's, or ``infer.py`` fails.
    """
    folder = Path(folder)
    run_dir = run_of(folder)
    card = json.loads((folder / "card.json").read_text())
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="edgefold-check-"))
    try:
        interpreter = Path(python) if python else fresh_python(folder / "requirements.txt", workdir, log)
        images = workdir / "images"
        count = len(hooks.write_test_images(run_dir, images))
        if mode == "auto" and count > PROBE_IMAGES:
            probe = _infer(interpreter, folder, images, workdir, PROBE_IMAGES)
            projected = probe["wall_s"] + count * probe["stats"]["whole_ms_p50"] / 1000
            if time.perf_counter() - started + projected > AUTO_BUDGET_S:
                log(f"check: infer.py on all {count} test images would take about {projected:.0f} s more; "
                    f"run it when you can: edgefold ship {folder} --check")
                return None
        ran = _infer(interpreter, folder, images, workdir)
        stats = ran["stats"]
        score = hooks.score_answers(run_dir, ran["answers"])
        expected, what = reference(card, stats["runtime"])
        per_image = (card["figures"].get("latency_p50_ms") or 0) / max(1, card["measured_under"].get("batch") or 1)
        record = {"passed": expected is not None and abs(score - expected) <= 1e-9, "score": score,
                  "expected": expected, "expected_is": what, "images": count, "runtime": stats["runtime"],
                  "ran_on": platform.node(), "python": "a fresh environment from requirements.txt" if not python
                  else str(python), "network_ms_per_image": stats["network_ms_p50"],
                  "whole_ms_per_image": stats["whole_ms_p50"],
                  "agent_ms_per_image": per_image or None, "device": card["measured_under"]["device"],
                  "time_ratio": stats["network_ms_p50"] / per_image if per_image else None,
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.perf_counter() - started, 1)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    card["check"] = record
    (folder / "card.json").write_text(json.dumps(card, indent=1, default=str) + "\n")
    (folder / "card.md").write_text(card_markdown(card))
    log(check_text(record, card["metric"]))
    if not record["passed"]:
        shown = "none" if expected is None else f"{100 * expected:.4f}"
        raise CheckFailed(f"infer.py scored {card['metric']} {100 * score:.4f} on the {count} test images where "
                          f"{what} is {shown}",
                          fix="the folder does not run as it was measured: report it to EdgeFold with card.json")
    return record

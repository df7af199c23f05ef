"""A native crash that names itself.

A segfault or an abort inside PyTorch's C++ (PyTorch 2.14.1 training timm's ``fastvit_t8`` in channels_last on a
CPU with AVX2 kernels: "double free or corruption", exit 139) kills the Python process before any handler of ours
runs, so the user saw nothing from EdgeFold. Two parts answer it:

- the ``edgefold`` console command runs a pipeline run in a child process (:func:`supervised`) and, when that child
  dies of a signal, says which stage, which training step and which settings were in force, and the setting known
  to trigger such crashes with the key that turns it off: what the child last wrote with :func:`mark` (a small JSON
  file, rewritten at each stage and at the first training steps);
- the training engine tries a channels_last step in a forked child before it commits a run to that memory format
  (:mod:`pipeline.train.trial`).

No torch here: the supervising parent imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

BREADCRUMB_ENV = "EDGEFOLD_BREADCRUMB"
"""Where a supervised run writes what it is doing (set by :func:`supervised` for its child)."""

_state: dict[str, Any] = {}


TRAIN_KEYS = {"teacher": "teacher.train", "distill": "distill.train", "prune": "prune.finetune",
              "quantize": "quantize.qat"}
"""The recipe section whose training a stage runs: the key a fix names."""


def mark(**facts: Any) -> None:
    """Records what the run is doing now (``stage=…``; ``step=…``, ``memory_format=…`` …) where a supervising
    parent reads it after a crash; ``stage`` starts a new record (with its training section's key). Written to a
    file only in a supervised run."""
    if "stage" in facts:
        _state.clear()
        facts.setdefault("train_key", TRAIN_KEYS.get(facts["stage"]))
    _state.update(facts)
    path = os.environ.get(BREADCRUMB_ENV)
    if not path:
        return
    try:
        temporary = f"{path}.tmp"
        with open(temporary, "w") as out:
            json.dump(_state, out)
        os.replace(temporary, path)
    except OSError:  # the record is a courtesy: a full disk must not stop the run
        pass


def current() -> dict[str, Any]:
    """What :func:`mark` last recorded in this process."""
    return dict(_state)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def crash_report(number: int, facts: dict[str, Any]) -> tuple[str, str]:
    """The message and the fix for a run that died of signal ``number`` while doing what ``facts`` recorded."""
    stage = facts.get("stage", "an unknown")
    where = f"the {stage} stage"
    if facts.get("step") is not None:
        where += f", training step {facts['step']} of epoch {facts.get('epoch', '?')} ({facts.get('desc', stage)})"
    elif facts.get("doing"):
        where += f", {facts['doing']}"
    settings = [f"{key} {value}" for key, value in (("memory format", facts.get("memory_format")),
                                                     ("autocast", facts.get("autocast")),
                                                     ("threads", facts.get("threads"))) if value is not None]
    message = (f"{where} died of {signal_name(number)} (signal {number}): a crash inside native code (PyTorch, "
               "oneDNN, ONNX Runtime), not a Python error"
               + (f"; in force: {', '.join(settings)}" if settings else ""))
    key = facts.get("train_key")
    if facts.get("memory_format") == "channels_last" and key:
        fix = (f"channels_last is the setting known to trigger this (PyTorch 2.14.1 crashes training timm's "
               f"fastvit_t8 in channels_last on a CPU): SET='{key}.channels_last=false' "
               f"(edgefold run … --set {key}.channels_last=false)")
    elif key and facts.get("autocast") not in (None, "fp32"):
        fix = (f"try it without mixed precision (SET='{key}.amp=off') and on one thread (OMP_NUM_THREADS=1); if it "
               "still dies, report it with the model and the lines above")
    else:
        fix = ("run it again on one thread (OMP_NUM_THREADS=1 make edge …); if it still dies, report it with the model "
               "and this message")
    return message, fix


def supervised(argv: Sequence[str]) -> int:
    """Runs ``edgefold`` with ``argv`` in a child process and returns its exit code; a child killed by a signal is
    reported (:func:`crash_report`) and answered with exit code 2, as every EdgeFold error."""
    with tempfile.TemporaryDirectory(prefix="edgefold-run-") as folder:
        record = Path(folder) / "doing.json"
        env = {**os.environ, BREADCRUMB_ENV: str(record)}
        child = subprocess.Popen([sys.executable, "-m", "pipeline", *argv], env=env)
        try:
            code = child.wait()
        except KeyboardInterrupt:  # the child has the same SIGINT (one process group): let it finish its own way
            code = child.wait()
        if code >= 0:
            return code
        if -code in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            print(f"edgefold: the run was stopped ({signal_name(-code)}); completed stages are kept and will be "
                  "skipped next time", file=sys.stderr)
            return 128 - code
        try:
            facts = json.loads(record.read_text())
        except (OSError, ValueError):
            facts = {}
        message, fix = crash_report(-code, facts)
        print(f"error: {message}", file=sys.stderr)
        print(f"  fix: {fix}", file=sys.stderr)
        return 2

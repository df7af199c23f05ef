"""``edgefold diverge`` on a copy of a finished run of any task, against a real agent started here (a real uvicorn
server on loopback running ONNX Runtime): the run's own loopback agent is gone when the run ends, so the copy's deploy
record is pointed at this one. Its arithmetic is the reference's, so the answer is "agrees"."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np


def run_copy(run_dir: Path, tmp_path: Path) -> Path:
    """The run copied under ``tmp_path/runs/<model>/``: a search writes into it and rebuilds its report."""
    target = tmp_path / "runs" / run_dir.parent.name / run_dir.name
    shutil.copytree(run_dir, target, symlinks=True)
    return target


def point_deploy_at(run_dir: Path, name: str, url: str, rung: str = "student_int8", state: str = "succeeded") -> None:
    """The first device of the deploy record renamed and moved to ``url``, ``rung`` in ``state`` there."""
    path = run_dir / "deploy" / "results.json"
    results = json.loads(path.read_text())
    results["devices"][0].update(name=name, url=url)
    results["devices"][0]["rungs"][rung]["state"] = state
    path.write_text(json.dumps(results))


def diverge_on_an_agent(run_dir: Path, tmp_path: Path, rung: str = "student_int8") -> tuple[int, dict, str]:
    """``edgefold diverge RUN --rung RUNG --device bench-agent`` on 3 images, 2 tensors a job: the exit code, the
    answer written and report.md after it."""
    from device.service.loopback import LoopbackAgent
    from pipeline.cli import main

    with LoopbackAgent(tmp_path / "agent") as agent:
        point_deploy_at(run_dir, "bench-agent", agent.url, rung)
        code = main(["diverge", str(run_dir), "--rung", rung, "--device", "bench-agent", "--images", "3",
                     "--chunk", "2", "--token-file", str(agent.token_file)])
    answer = json.loads((run_dir / "diverge" / f"{rung}@bench-agent.json").read_text())
    return code, answer, (run_dir / "report" / "report.md").read_text()


def sent_set_digest(run_dir: Path, rung: str) -> tuple[str, str]:
    """(the sha256 of the evaluation set the deploy stage sent for ``rung``, as its round-1 job names it; the sha256
    of the set the task's ``evaluation_inputs`` rebuilds from the run), both as ``np.save`` writes them."""
    from pipeline import tasks
    from pipeline.core.manifest import Manifest

    results = json.loads((run_dir / "deploy" / "results.json").read_text())
    record = results["devices"][0]["rungs"][rung]
    hooks = tasks.of_run(run_dir).stages.get("deploy").hooks
    rebuilt = hooks.evaluation_inputs(Manifest.load(run_dir), run_dir / results["artifacts"][rung]["path"],
                                      results["evaluation"]["indices"])
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(rebuilt), allow_pickle=False)
    return record["spec"]["evaluation"]["artifact"], hashlib.sha256(buffer.getvalue()).hexdigest()

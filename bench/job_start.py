"""Job start-up: a job process forked from the agent's zygote against a fresh ``python -m device.jobs.jobrun``.

    python bench/job_start.py                     # 12 short jobs each way, interleaved

Two executors on one host, one forking its jobs from a zygote (device.service.launcher), one starting each fresh, run
the same short ONNX Runtime job alternately (the order swapped every pair, so drift hits both alike). Reported
per way: each job's wall time from its start to its end as the agent recorded it, the median, and the ratio
of medians with a bootstrap 95% interval over pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

GOAL = ("Goal, stated before the run: a short job (3 timed calls of a tiny model) ends at least 1.2x sooner when "
        "forked from the zygote than when started fresh (ratio of median job times, the interval's lower bound "
        "above 1.0).")
JOB = {"iterations": 3, "warmup_iterations": 0, "idle_s": 0, "batch_sizes": [1], "telemetry": ["host"]}


def tiny_onnx(path: Path) -> Path:
    """A small real ONNX classifier (Conv, Relu, global pool, Gemm), batch axis dynamic."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "w"),
               numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32) * 0.2, "fc")]
    nodes = [helper.make_node("Conv", ["input", "w"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"]), helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
             helper.make_node("Flatten", ["pool"], ["flat"]), helper.make_node("Gemm", ["flat", "fc"], ["logits"],
                                                                                transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                             ["batch", 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def run_one(executor, sha: str) -> float:
    """One job's wall time, started to finished, as the agent's store recorded it."""
    from device.schema import JobSpec

    job = executor.store.submit(JobSpec(artifact=sha, **JOB))
    executor.wake()
    while (done := executor.store.get(job.id)).state in ("queued", "running"):
        time.sleep(0.02)
    if done.state != "succeeded":
        raise SystemExit(f"job {job.id} {done.state}: {done.error}")
    return done.finished_at - done.started_at


def main() -> int:
    from device.service.executor import Executor
    from device.service.store import Store

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    print(GOAL, flush=True)
    times: dict[str, list[float]] = {"forked": [], "fresh": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_onnx(Path(tmp) / "tiny.onnx")
        sha = hashlib.sha256(model.read_bytes()).hexdigest()
        executors = {}
        for way in times:
            store = Store(Path(tmp) / way)
            copy = store.temp_file()
            copy.write_bytes(model.read_bytes())
            store.add_artifact(sha, "onnx", copy)
            executors[way] = Executor(store, jtop_socket=None, use_zygote=way == "forked")
            executors[way].start()
        try:
            for way in times:  # one job each first: the zygote's imports are not a job's
                run_one(executors[way], sha)
            for pair in range(args.pairs):
                order = ("forked", "fresh") if pair % 2 == 0 else ("fresh", "forked")
                for way in order:
                    times[way].append(run_one(executors[way], sha))
                print(f"pair {pair + 1}/{args.pairs}: forked {times['forked'][-1]:.3f} s, "
                      f"fresh {times['fresh'][-1]:.3f} s", flush=True)
        finally:
            for executor in executors.values():
                executor.stop()
    forked, fresh = np.array(times["forked"]), np.array(times["fresh"])
    ratio = float(np.median(fresh) / np.median(forked))
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(2000):
        picked = rng.integers(0, len(forked), len(forked))
        draws.append(np.median(fresh[picked]) / np.median(forked[picked]))
    low, high = (float(v) for v in np.percentile(draws, [2.5, 97.5]))
    met = ratio >= 1.2 and low > 1.0
    lines = [f"# Job start-up: forked from the zygote vs fresh ({time.strftime('%Y-%m-%d %H:%M')})", "", GOAL, "",
             "| way | jobs | median s | every job, s |", "|---|---|---|---|"]
    for way, values in times.items():
        lines.append(f"| {way} | {len(values)} | {np.median(values):.3f} | "
                     f"{', '.join(f'{v:.3f}' for v in values)} |")
    lines += ["", f"fresh / forked (medians): **{ratio:.2f}x** [{low:.2f}, {high:.2f}] -> goal "
                  f"{'met' if met else 'NOT met'}"]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"job-start-{stamp}.md").write_text(text)
    (out / f"job-start-{stamp}.json").write_text(json.dumps({"goal": GOAL, "job": JOB, "times": times,
                                                             "ratio": ratio, "interval": [low, high], "met": met},
                                                            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

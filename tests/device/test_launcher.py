"""Job processes forked from the zygote (device.service.launcher): as isolated as fresh ones, and never stuck on it.

The executor runs in-process on a real store; its jobs are real children on a tiny real ONNX model.
"""

import os
import signal
import subprocess
import time

import pytest

from device.service.executor import Executor
from device.service.launcher import ForkedJob
from device.schema import JobSpec
from device.service.store import Store
from tests.device.agent_process import keep_launched, store_model

QUICK = {"iterations": 3, "warmup_iterations": 0, "idle_s": 0, "batch_sizes": [1], "telemetry": ["host"]}
WAIT_S = 120


@pytest.fixture
def executor(tmp_path, monkeypatch):
    """A started executor whose job processes are kept in ``executor.children``, with a stored tiny model."""
    children = keep_launched(monkeypatch)
    store = Store(tmp_path / "data")
    executor = Executor(store, jtop_socket=None)
    executor.children, executor.sha = children, store_model(store, tmp_path / "tiny.onnx")
    executor.start()
    yield executor
    executor.stop()


def start_long_job(executor):
    """Submits a 60 s job and returns it and its process once the job is measuring."""
    job = executor.store.submit(JobSpec(artifact=executor.sha, duration_s=60, idle_s=0, telemetry=["host"]))
    executor.wake()
    deadline = time.monotonic() + WAIT_S
    while not executor.children or not (executor.store.job_dir(job.id) / "progress.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return job, executor.children[-1]


def run(executor, **spec) -> str:
    job = executor.store.submit(JobSpec(artifact=executor.sha, **{**QUICK, **spec}))
    executor.wake()
    deadline = time.monotonic() + WAIT_S
    while executor.store.get(job.id).state in ("queued", "running") or executor.running_job == job.id:
        assert time.monotonic() < deadline, "the job never ended"
        time.sleep(0.05)
    return job.id


def zygote_pid(executor) -> int:
    return executor._launcher._zygote.process.pid


def test_jobs_are_forked_children_of_one_zygote_each_in_its_own_session(executor):
    first, second = run(executor), run(executor)
    assert [executor.store.get(j).state for j in (first, second)] == ["succeeded", "succeeded"]
    assert all(isinstance(child, ForkedJob) and child.returncode == 0 for child in executor.children)
    assert executor.children[0].pid != executor.children[1].pid
    log = (executor.store.job_dir(first) / "log.txt")
    assert log.exists(), "the child's stdout and stderr go to its job's log"
    # The zygote's own command line, so the orphan check reads the cwd; the zygote leads its own session.
    assert b"device.service.zygote" in open(f"/proc/{zygote_pid(executor)}/cmdline", "rb").read()


def test_a_forked_job_is_killed_with_its_group_by_a_cancel(executor):
    job, child = start_long_job(executor)
    assert isinstance(child, ForkedJob) and os.getpgid(child.pid) == child.pid, "its own process group"
    assert executor.cancel(job.id)
    assert child.wait(timeout=30) == -signal.SIGKILL and executor.store.get(job.id).state == "cancelled"


def test_a_dead_zygote_costs_one_fresh_process_and_is_started_again(executor):
    assert executor.store.get(run(executor)).state == "succeeded"  # the zygote is ready
    old = zygote_pid(executor)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while executor._launcher._zygote.process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    fresh, again = run(executor), run(executor)
    assert [executor.store.get(j).state for j in (fresh, again)] == ["succeeded", "succeeded"]
    assert isinstance(executor.children[-2], subprocess.Popen), "the job after the death starts fresh"
    assert isinstance(executor.children[-1], ForkedJob) and zygote_pid(executor) != old, "a new zygote forks again"


def test_a_job_whose_zygote_dies_fails_as_killed_instead_of_waiting_forever(executor):
    job, child = start_long_job(executor)
    os.kill(zygote_pid(executor), signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while executor.store.get(job.id).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ended = executor.store.get(job.id)
    assert ended.state == "failed" and "killed by SIGKILL" in ended.error
    assert not os.path.exists(f"/proc/{child.pid}") or open(f"/proc/{child.pid}/stat").read().split(")")[1].split()[0] \
        == "Z", "the measurement does not run on unseen"


def test_fork_jobs_false_starts_each_job_fresh_and_no_zygote(tmp_path, monkeypatch):
    from device.service.agent import AgentConfig, create_app

    app = create_app(AgentConfig(data_dir=tmp_path / "data", fork_jobs=False), token="t" * 24)
    executor = app.state.executor
    children = keep_launched(monkeypatch)
    executor.sha = store_model(executor.store, tmp_path / "tiny.onnx")
    executor.start()
    try:
        assert executor.store.get(run(executor)).state == "succeeded"
    finally:
        executor.stop()
    assert isinstance(children[0], subprocess.Popen) and executor._launcher._zygote is None

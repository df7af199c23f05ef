"""The agent survives any request and any crash: no wedged queue, no ghost jobs, no 500s.

Each way the agent once failed has its test here; the agent runs in-process (FastAPI's
TestClient) and its jobs run as real children on a tiny real ONNX model.
"""

import errno
import hashlib
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from fastapi.testclient import TestClient

from device.service import executor as executor_module
from device.service.agent import AgentConfig, create_app
from device.service.executor import Executor
from device.schema import JobSpec
from device.service.store import Store
from tests.device.agent_process import TOKEN, keep_launched, tiny_onnx

AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUICK = {"iterations": 3, "warmup_iterations": 0, "idle_s": 0, "batch_sizes": [1], "telemetry": ["host"]}
TINY_PREPROCESS = {"input_size": 16, "resize": 16, "channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3}
WAIT_S = 120  # a bound on waiting for a job's end, so a broken agent fails the test instead of hanging it


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_onnx(tmp_path_factory.mktemp("model") / "tiny.onnx")


def make_app(tmp_path, **settings):
    return create_app(AgentConfig(data_dir=tmp_path / "data", **settings), token=TOKEN)


def upload(client, model) -> str:
    data = model.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    assert client.put(f"/v1/artifacts/{sha}", content=data, headers=AUTH).status_code == 201
    return sha


def post_raw(client, body: dict):
    # json.dumps writes NaN/Infinity tokens and \ud800 escapes, as a careless client's JSON library does.
    return client.post("/v1/jobs", content=json.dumps(body), headers={**AUTH, "Content-Type": "application/json"})


def wait_terminal(client, job_id: str) -> dict:
    deadline = time.monotonic() + WAIT_S
    while True:
        job = client.get(f"/v1/jobs/{job_id}", headers=AUTH).json()
        if job["state"] not in ("queued", "running"):
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['state']}: the queue is wedged"
        time.sleep(0.1)


def wait_store(store: Store, job_id: str, executor: Executor) -> str:
    """The job's final state, or the reason it never got one (a dead executor thread)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        state = store.get(job_id).state
        if state not in ("queued", "running") and executor.running_job is None:
            return state
        if not executor._thread.is_alive():  # the thread itself, as an agent without `alive` would be
            return f"still {state}: the executor thread died"
        assert time.monotonic() < deadline, f"job {job_id} still {state}"
        time.sleep(0.1)


def insert_raw_job(store: Store, spec_json: str, state: str = "queued") -> str:
    """A row as an older agent (or a hand edit) may have left it, bypassing validation."""
    job_id = "raw" + hashlib.sha256(spec_json.encode()).hexdigest()[:9]
    with sqlite3.connect(store.db_path) as db:
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
        db.execute("INSERT INTO jobs (id, state, spec, created_at, seq) VALUES (?, ?, ?, ?, ?)",
                   (job_id, state, spec_json, time.time(), seq))
    return job_id


# ---------------------------------------------------------------- failure 1: a NaN in preprocess wedged the agent
def test_nan_in_preprocess_is_refused_and_the_queue_keeps_moving(tmp_path, model):
    with TestClient(make_app(tmp_path), raise_server_exceptions=False) as client:
        sha = upload(client, model)
        response = post_raw(client, {"artifact": sha, **QUICK, "preprocess": {**TINY_PREPROCESS, "resize": math.nan}})
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["loc"] == ["body", "preprocess", "resize"]
        assert client.get("/v1/jobs", headers=AUTH).status_code == 200
        assert client.get("/v1/jobs", headers=AUTH).json() == [], "a refused job is never stored"
        job = post_raw(client, {"artifact": sha, **QUICK, "preprocess": TINY_PREPROCESS})
        assert job.status_code == 201, job.text
        assert wait_terminal(client, job.json()["id"])["state"] == "succeeded"
        assert client.get("/v1/health").json()["status"] == "ok"


def test_a_stored_spec_that_no_longer_validates_fails_on_read_not_500(tmp_path, model):
    app = make_app(tmp_path)
    client = TestClient(app, raise_server_exceptions=False)  # no lifespan: the executor stays out of it
    sha = upload(client, model)
    # What the old agent stored for `resize: NaN`: json null where an integer belongs.
    bad = insert_raw_job(app.state.store, json.dumps({"artifact": sha, "preprocess": {**TINY_PREPROCESS,
                                                                                      "resize": None}}))
    listed = client.get("/v1/jobs", headers=AUTH)
    assert listed.status_code == 200, listed.text
    (job,) = listed.json()
    assert job["id"] == bad and job["state"] == "failed" and job["spec"] is None
    assert "no longer validates" in job["error"] and "preprocess.resize" in job["error"]
    again = client.get(f"/v1/jobs/{bad}", headers=AUTH)
    assert again.status_code == 200 and again.json()["state"] == "failed"


def test_the_executor_skips_a_bad_row_and_runs_the_next_job(tmp_path, model):
    store = Store(tmp_path / "data")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    copy = store.temp_file()
    copy.write_bytes(model.read_bytes())
    store.add_artifact(sha, "onnx", copy)
    bad = insert_raw_job(store, json.dumps({"artifact": sha, "duration_s": None, "idle_s": "NaN"}))
    good = store.submit(JobSpec(artifact=sha, **QUICK))
    executor = Executor(store, jtop_socket=None)
    executor.start()
    try:
        assert wait_store(store, good.id, executor) == "succeeded"
    finally:
        executor.stop()
    assert store.get(bad).state == "failed" and not executor.alive


class FlakyStore(Store):
    """A store whose first claims fail as a locked or full database does."""

    failures = 2

    def claim_next(self):
        if self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("database is locked")
        return super().claim_next()


def test_the_executor_outlives_a_failing_claim(tmp_path, model, monkeypatch):
    monkeypatch.setattr(executor_module, "RETRY_S", 0.05, raising=False)
    store = FlakyStore(tmp_path / "data")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    copy = store.temp_file()
    copy.write_bytes(model.read_bytes())
    store.add_artifact(sha, "onnx", copy)
    job = store.submit(JobSpec(artifact=sha, **QUICK))
    executor = Executor(store, jtop_socket=None)
    executor.start()
    try:
        assert wait_store(store, job.id, executor) == "succeeded"
        assert executor.alive and store.failures == 0
    finally:
        executor.stop()


def test_health_is_503_when_the_executor_is_not_running(tmp_path):
    client = TestClient(make_app(tmp_path))  # no lifespan: the executor never started
    response = client.get("/v1/health")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy" and body["executor_alive"] is False and "restart" in body["problem"]


def test_health_is_ok_while_the_executor_runs(tmp_path):
    with TestClient(make_app(tmp_path)) as client:
        response = client.get("/v1/health")
    assert response.status_code == 200 and response.json()["status"] == "ok"


# ---------------------------------------------------------------- failure 2: NaN, Infinity and surrogates were 500s
# One case for each way a body reaches the API (the schema's own bounds, field by field, are tested on JobSpec in
# test_agent_spec.py): NaN and -Infinity tokens, a lone surrogate in a value and in a key, a string for a number,
# an integer past any machine width, an unknown key.
HOSTILE = [("duration_s", math.nan), ("idle_s", -math.inf), ("label", "rung \ud800"), ("iterations", "5"),
           ("batch_sizes", [10**40]), ("unknown", 1), ("\ud800unknown", 1)]


@pytest.mark.parametrize(("field", "value"), HOSTILE, ids=[f"{f}={v!a}"[:40] for f, v in HOSTILE])
def test_non_finite_numbers_surrogates_and_strings_for_numbers_are_422(tmp_path, model, field, value):
    client = TestClient(make_app(tmp_path), raise_server_exceptions=False)
    sha = upload(client, model)
    response = post_raw(client, {"artifact": sha, field: value})
    assert response.status_code == 422, (field, response.status_code, response.text[:300])
    body = response.json()
    assert body["detail"].startswith("invalid request") and body["fix"]
    # A key that is not valid text fails as the whole body; anything else names its field.
    where = ["body"] if "\ud800" in field else ["body", field]
    assert any(problem["loc"][:len(where)] == where for problem in body["errors"]), body["errors"]
    assert client.get("/v1/jobs", headers=AUTH).json() == []


def test_non_json_bodies_are_4xx_with_an_error_body(tmp_path):
    client = TestClient(make_app(tmp_path), raise_server_exceptions=False)
    for content in (b"\xff\xfe\x00garbage", b"{not json", b"[]", b'"x"', b"NaN", b"1e999"):
        response = client.post("/v1/jobs", content=content, headers={**AUTH, "Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, (content, response.status_code)
        assert isinstance(response.json()["detail"], str)


def test_oversized_job_bodies_are_413_with_an_error_body(tmp_path):
    client = TestClient(make_app(tmp_path), raise_server_exceptions=False)
    big = json.dumps({"artifact": "a" * 64, "label": "x" * 100_000}).encode()

    def streamed():  # no Content-Length: refused once the limit is passed
        yield big

    for content in (big, streamed()):
        response = client.post("/v1/jobs", content=content, headers={**AUTH, "Content-Type": "application/json"})
        assert response.status_code == 413 and "request body over" in response.json()["detail"]


# ---------------------------------------------------------------- failure 3: a cancel right after the claim
class CancelWhenStarting(Store):
    """Cancels the job from another thread at the instant the executor looks up its artifact.

    That lookup sits between the claim (job marked running) and the child's start: the gap in
    which a DELETE used to mark the job cancelled while its child went on to run in full.
    """

    executor: Executor | None = None
    answers: list = []

    def get_artifact(self, sha256):
        found = super().get_artifact(sha256)
        if threading.current_thread().name == "edgefold-executor" and not self.answers:
            job_id = self.list(state="running")[0].id
            canceller = threading.Thread(target=lambda: self.answers.append(self.executor.cancel(job_id)))
            canceller.start()
            # The cancel must not get through before the child exists; give it the chance to try.
            canceller.join(0.5)
        return found


def test_a_cancel_between_claim_and_child_start_kills_the_child(tmp_path, model, monkeypatch):
    children = keep_launched(monkeypatch)
    store = CancelWhenStarting(tmp_path / "data")
    store.answers = []
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    copy = store.temp_file()
    copy.write_bytes(model.read_bytes())
    store.add_artifact(sha, "onnx", copy)
    job = store.submit(JobSpec(artifact=sha, duration_s=2.0, idle_s=0, warmup_iterations=0, telemetry=["host"]))
    executor = Executor(store, jtop_socket=None)
    store.executor = executor
    executor.start()
    try:
        wait_store(store, job.id, executor)
        deadline = time.monotonic() + WAIT_S
        while not store.answers or any(child.poll() is None for child in children):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        executor.stop()
    assert store.answers == [True] and store.get(job.id).state == "cancelled"
    (child,) = children
    assert child.returncode == -signal.SIGKILL, f"the cancelled job's child ran on (exit {child.returncode})"
    assert not (store.job_dir(job.id) / "result.json").exists()


def _measuring_job(client, model) -> str:
    """A minute-long job, once it is inside its timed window."""
    sha = upload(client, model)
    job_id = post_raw(client, {"artifact": sha, "duration_s": 60, "idle_s": 0, "telemetry": ["host"]}).json()["id"]
    deadline = time.monotonic() + WAIT_S
    while "measuring" not in (client.get(f"/v1/jobs/{job_id}", headers=AUTH).json()["progress"] or ""):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return job_id


def test_a_cancelled_running_job_leaves_no_child(tmp_path, model):
    with TestClient(make_app(tmp_path)) as client:
        job_id = _measuring_job(client, model)
        pid = client.app.state.executor._child.pid
        assert client.delete(f"/v1/jobs/{job_id}", headers=AUTH).json()["state"] == "cancelled"
        # The DELETE returns once SIGKILL went to the child's whole session; the kernel then ends it.
        deadline = time.monotonic() + 30
        while not _gone_or_zombie(pid):
            assert time.monotonic() < deadline, "the cancelled job's child is still running"
            time.sleep(0.05)


def test_a_job_folder_is_swept_of_half_written_files_however_the_job_ends(tmp_path, model):
    """A child killed between creating a temporary and renaming it (a cancel 17 ms in, while it wrote its
    progress) leaves ``.progress.json.<pid>-<hex>.tmp``: swept when the job ends and at the next start."""
    from device.files import sweep_temporaries

    with TestClient(make_app(tmp_path)) as client:
        job_id = _measuring_job(client, model)
        job_dir = client.app.state.executor.store.job_dir(job_id)
        torn = job_dir / ".progress.json.4242-0badc0de.tmp"
        torn.write_text('{"progr')
        assert client.delete(f"/v1/jobs/{job_id}", headers=AUTH).json()["state"] == "cancelled"
        deadline = time.monotonic() + 30
        while torn.exists():
            assert time.monotonic() < deadline, "the cancelled job's temporary is still there"
            time.sleep(0.05)
        assert (job_dir / "job.json").exists() and (job_dir / "log.txt").exists(), "only temporaries go"
    # The rule itself: atomic_writer's names only, never a file that merely ends in .tmp.
    (tmp_path / ".result.json.17-0123abcd.tmp").write_text("x")
    (tmp_path / "mine.tmp").write_text("x")
    assert sweep_temporaries(tmp_path) == [".result.json.17-0123abcd.tmp"] and (tmp_path / "mine.tmp").exists()


def _gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


# ---------------------------------------------------------------- failure 4: cancelled jobs were never counted
def _finished_total(client) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics", headers=AUTH).text)}
    return {s.labels["state"]: s.value for s in families["edgefold_agent_jobs_finished"].samples
            if s.name.endswith("_total")}


def test_metrics_count_cancels_recovery_and_failures_on_read(tmp_path, model):
    app = make_app(tmp_path)
    client = TestClient(app)  # no executor: only the API and the store make transitions here
    sha = upload(client, model)
    queued = post_raw(client, {"artifact": sha, **QUICK}).json()
    assert client.delete(f"/v1/jobs/{queued['id']}", headers=AUTH).json()["state"] == "cancelled"
    assert _finished_total(client)["cancelled"] == 1
    insert_raw_job(app.state.store, json.dumps({"artifact": sha, "iterations": "many"}))
    client.get("/v1/jobs", headers=AUTH)
    insert_raw_job(app.state.store, json.dumps({"artifact": sha}), state="running")
    app.state.executor.recover()
    totals = _finished_total(client)
    assert (totals["cancelled"], totals["failed"], totals["interrupted"], totals["succeeded"]) == (1, 1, 1, 0)


# ---------------------------------------------------------------- also noticed
def _lookalike(job_dir) -> subprocess.Popen:
    """A process whose command line looks like a job child of ``job_dir``; it echoes stdin while alive."""
    return subprocess.Popen([sys.executable, "-c", "import sys\nfor line in sys.stdin: print(line, end='', flush=True)",
                             "-m", "device.jobs.jobrun", str(job_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            start_new_session=True)


def _answers(process: subprocess.Popen) -> bool:
    # A SIGKILL sent before this write ends the process before it can echo: no timing involved.
    try:
        process.stdin.write(b"ping\n")
        process.stdin.flush()
    except BrokenPipeError:
        return False
    return process.stdout.readline() == b"ping\n"


def _end(*processes: subprocess.Popen) -> None:
    for process in processes:
        process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except BrokenPipeError:  # the unflushed ping of a killed process
                pass


def test_recovery_kills_only_this_agents_children(tmp_path):
    store = Store(tmp_path / "mine")
    mine_id = insert_raw_job(store, json.dumps({"artifact": "a" * 64}), state="running")
    theirs_id = insert_raw_job(store, json.dumps({"artifact": "b" * 64}), state="running")
    mine = _lookalike(store.job_dir(mine_id))
    theirs = _lookalike(tmp_path / "other-agent" / "jobs" / theirs_id)  # another agent's child, our recorded pid
    try:
        assert _answers(mine) and _answers(theirs)
        store.set_pid(mine_id, mine.pid)
        store.set_pid(theirs_id, theirs.pid)
        Executor(store, jtop_socket=None).recover()
        assert _answers(theirs), "a process that is not this agent's job child was killed"
        assert not _answers(mine) and mine.wait(timeout=30) == -signal.SIGKILL
        assert {store.get(mine_id).state, store.get(theirs_id).state} == {"interrupted"}
    finally:
        _end(mine, theirs)


def test_recovery_finds_a_forked_child_by_its_working_directory(tmp_path):
    """A job forked by the zygote has the zygote's command line (``device.service.zygote``): only its working
    directory names its job."""
    store = Store(tmp_path / "mine")
    mine_id = insert_raw_job(store, json.dumps({"artifact": "a" * 64}), state="running")
    theirs_id = insert_raw_job(store, json.dumps({"artifact": "b" * 64}), state="running")
    elsewhere = tmp_path / "other-agent" / "jobs" / theirs_id
    for folder in (store.job_dir(mine_id), elsewhere):
        folder.mkdir(parents=True)
    command = [sys.executable, "-c", "import sys\nfor line in sys.stdin: print(line, end='', flush=True)",
               "-m", "device.service.zygote"]
    mine, theirs = (subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                                     cwd=folder) for folder in (store.job_dir(mine_id), elsewhere))
    try:
        assert _answers(mine) and _answers(theirs)
        store.set_pid(mine_id, mine.pid)
        store.set_pid(theirs_id, theirs.pid)
        Executor(store, jtop_socket=None).recover()
        assert _answers(theirs), "a zygote-forked process of another job dir was killed"
        assert not _answers(mine) and mine.wait(timeout=30) == -signal.SIGKILL
    finally:
        _end(mine, theirs)


def test_api_description_needs_the_token_unless_configured_public(tmp_path):
    closed = TestClient(make_app(tmp_path))
    assert closed.get("/openapi.json").status_code == 401
    assert closed.get("/docs").status_code == 404 and closed.get("/redoc").status_code == 404
    schema = closed.get("/openapi.json", headers=AUTH).json()
    assert "/v1/jobs" in schema["paths"] and "/openapi.json" not in schema["paths"]
    opened = TestClient(create_app(AgentConfig(data_dir=tmp_path / "open", public_docs=True), token=TOKEN))
    assert opened.get("/openapi.json").status_code == 200 and opened.get("/docs").status_code == 200


def test_a_stored_result_with_non_finite_numbers_is_served(tmp_path, model):
    app = make_app(tmp_path)
    client = TestClient(app, raise_server_exceptions=False)
    sha = upload(client, model)
    job = post_raw(client, {"artifact": sha, **QUICK}).json()
    store = app.state.store
    store.claim_next()
    assert store.finish(job["id"], "succeeded", result={"runs": [{"batch_size": 1, "latency_p50_ms": math.nan,
                                                                  "note": "\ud800"}]})
    served = client.get(f"/v1/jobs/{job['id']}", headers=AUTH)
    assert served.status_code == 200
    assert served.json()["result"]["runs"][0] == {"batch_size": 1, "latency_p50_ms": None, "note": "\\ud800"}
    assert client.get("/metrics", headers=AUTH).status_code == 200


# ---------------------------------------------------------------- ends the database never heard of
class EndsNotRecorded(Store):
    """A store whose database cannot record a job's end from the executor (a full or locked disk); the rest works."""

    def finish(self, job_id, state, result=None, error=None):
        if threading.current_thread().name == "edgefold-executor":
            raise sqlite3.OperationalError("database or disk is full")
        return super().finish(job_id, state, result=result, error=error)


def test_a_result_written_before_the_agent_died_is_recovered_not_interrupted(tmp_path, model):
    store = EndsNotRecorded(tmp_path / "data")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    copy = store.temp_file()
    copy.write_bytes(model.read_bytes())
    store.add_artifact(sha, "onnx", copy)
    job = store.submit(JobSpec(artifact=sha, **QUICK))
    executor = Executor(store, jtop_socket=None)
    executor.start()
    result_file = store.job_dir(job.id) / "result.json"
    try:
        deadline = time.monotonic() + WAIT_S
        while not (result_file.is_file() and executor.running_job is None):  # the child ended; its end unrecorded
            assert time.monotonic() < deadline, "the job never ended"
            time.sleep(0.1)
    finally:
        executor.stop()  # the agent dies: the end it kept in memory to retry dies with it
    assert store.get(job.id).state == "running"
    torn = store.job_dir(job.id) / ".progress.json.4242-0badc0de.tmp"  # a writer that died mid-write
    torn.write_text("{")

    restarted = Executor(Store(tmp_path / "data"), jtop_socket=None)  # the same SQLite file, a new process's view
    assert restarted.recover() == []
    assert not torn.exists(), "recovery sweeps the half-written files of the jobs it ends"
    recovered = restarted.store.get(job.id)
    assert recovered.state == "succeeded", recovered.error
    assert recovered.result == json.loads(result_file.read_text()) and recovered.result["runs"][0]["batch_size"] == 1


def test_recovery_records_an_error_json_as_failed_and_a_torn_result_as_interrupted(tmp_path):
    store = Store(tmp_path / "data")
    failed = insert_raw_job(store, json.dumps({"artifact": "a" * 64}), state="running")
    store.job_dir(failed).mkdir(parents=True)
    (store.job_dir(failed) / "error.json").write_text(json.dumps(
        {"message": "no engine for this model", "fix": "export with opset 17", "type": "EngineBuildError"}))
    torn = insert_raw_job(store, json.dumps({"artifact": "b" * 64}), state="running")
    store.job_dir(torn).mkdir(parents=True)
    (store.job_dir(torn) / "result.json").write_text('{"schema": "edgefold.result/2", "runs": [')
    assert Executor(store, jtop_socket=None).recover() == [torn]
    assert store.get(failed).state == "failed"
    assert store.get(failed).error == "EngineBuildError: no engine for this model\n  fix: export with opset 17"
    assert store.get(torn).state == "interrupted", "a result that does not read is no result"


# ---------------------------------------------------------------- an upload to a full disk
def test_an_upload_to_a_full_disk_is_507_with_the_space_needed_and_leaves_nothing(tmp_path, model, monkeypatch):
    # A full disk cannot be made here (no root to mount a small filesystem): the upload's file takes what
    # fits, then fails as write(2) does on a full disk, and its buffer cannot be flushed at close either.
    from device.uploads import artifacts

    class FullDisk:
        def __init__(self, handle):
            self.handle = handle

        def write(self, chunk):
            self.handle.write(chunk[: len(chunk) // 2])
            self.handle.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            if not self.handle.closed:
                self.handle.close()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(artifacts, "open", lambda path, mode: FullDisk(open(path, mode)), raising=False)
    data = model.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    client = TestClient(make_app(tmp_path), raise_server_exceptions=False)
    response = client.put(f"/v1/artifacts/{sha}", content=data, headers=AUTH)
    assert response.status_code == 507, response.text
    body = response.json()
    assert f"needs {len(data)} bytes" in body["detail"] and "are free" in body["detail"]
    assert "free space" in body["fix"] and "--data-dir" in body["fix"]
    assert not list((tmp_path / "data" / "tmp").iterdir()), "the partial upload is deleted"
    assert not list((tmp_path / "data" / "artifacts").iterdir())
    assert client.get(f"/v1/artifacts/{sha}", headers=AUTH).status_code == 404

"""The agent daemon, really served by uvicorn on loopback, driven over HTTP.

Only the crash and hang of a runtime are staged (``EDGEFOLD_AGENT_FAULT``): nothing else can make
ONNX Runtime segfault or deadlock on purpose. Everything else is the real thing.
"""

import hashlib
import os
import signal
import threading
import time

import httpx
import pytest

from device.client import AgentError, JobTimeoutError
from device.files import sha256_file
from device.schema import RESULT_SCHEMA
from tests.device.agent_process import TOKEN, AgentProcess, tiny_onnx
from tests.slow import slow_fixture

AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUICK = {"iterations": 5, "warmup_iterations": 1, "idle_s": 0, "batch_sizes": [1, 4], "telemetry": ["host"]}


@pytest.fixture(scope="module")
@slow_fixture
def agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent")
    with AgentProcess(root / "data", env={"EDGEFOLD_AGENT_FAULT": "crash-me=segv,hang-me=hang"},
                      args=("--max-upload-mib", "1")) as process:
        yield process


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_onnx(tmp_path_factory.mktemp("model") / "tiny.onnx")


def stored(agent):
    return sorted(p.name for p in (agent.data_dir / "artifacts").iterdir())


def leftovers(agent):
    return list((agent.data_dir / "tmp").iterdir())


def test_health_needs_no_token_and_the_rest_does(agent):
    health = httpx.get(f"{agent.url}/v1/health").json()
    assert health["status"] == "ok" and health["version"]
    for method, path in (("GET", "/v1/device"), ("GET", "/v1/jobs"), ("GET", "/metrics"), ("POST", "/v1/jobs")):
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": "Basic abc"}):
            response = httpx.request(method, f"{agent.url}{path}", headers=headers, json={})
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.headers.get("www-authenticate") == "Bearer"


def test_wrong_token_changes_nothing(agent, model):
    data = model.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    before = stored(agent)
    response = httpx.put(f"{agent.url}/v1/artifacts/{sha}", content=data, headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401 and stored(agent) == before
    with agent.client() as client:
        jobs_before = client.jobs()
    response = httpx.post(f"{agent.url}/v1/jobs", json={"artifact": sha}, headers={"Authorization": "Bearer x"})
    assert response.status_code == 401
    with agent.client() as client:
        assert client.jobs() == jobs_before


def test_device_describes_the_machine(agent):
    with agent.client() as client:
        info = client.device()
    assert info["machine"] and info["onnxruntime"] and "CPUExecutionProvider" in info["onnxruntime_providers"]
    assert {"l4t", "jetpack", "tensorrt", "cuda", "gpu", "nvpmodel", "jetson_clocks", "torch"} <= set(info)


def test_corrupted_upload_is_refused_with_its_hash(agent, model):
    data = model.read_bytes()
    claimed = hashlib.sha256(data).hexdigest()
    corrupted = data[:-1] + bytes([data[-1] ^ 0xFF])
    response = httpx.put(f"{agent.url}/v1/artifacts/{claimed}", content=corrupted, headers=AUTH)
    assert response.status_code == 400
    body = response.json()
    assert hashlib.sha256(corrupted).hexdigest() in body["detail"] and claimed in body["detail"] and body["fix"]
    assert claimed + ".onnx" not in stored(agent) and not leftovers(agent)


def test_oversized_non_onnx_and_traversal_uploads_store_nothing(agent):
    before = stored(agent)
    big = os.urandom((1 << 20) + 10)  # the module's agent caps uploads at 1 MiB
    response = httpx.put(f"{agent.url}/v1/artifacts/{hashlib.sha256(big).hexdigest()}", content=big, headers=AUTH)
    assert response.status_code == 413 and "1 MiB" in response.json()["detail"]

    def chunked():  # no Content-Length: the cap must hold while streaming too
        for _ in range(3):
            yield os.urandom(600_000)

    response = httpx.put(f"{agent.url}/v1/artifacts/{'ab' * 32}", content=chunked(), headers=AUTH)
    assert response.status_code == 413

    text = b"this is not a model\n" * 10
    response = httpx.put(f"{agent.url}/v1/artifacts/{hashlib.sha256(text).hexdigest()}", content=text, headers=AUTH)
    assert response.status_code == 422 and "not a valid ONNX model" in response.json()["detail"]

    zipped = b"PK\x03\x04" + b"\0" * 100
    response = httpx.put(f"{agent.url}/v1/artifacts/{hashlib.sha256(zipped).hexdigest()}", content=zipped,
                         headers=AUTH)
    assert response.status_code == 422

    for name in ("..%2F..%2Fetc%2Fpasswd", "../../x", "ABC", "a" * 63, "a" * 64 + ".onnx", "%2e%2e"):
        response = httpx.put(f"{agent.url}/v1/artifacts/{name}", content=b"x", headers=AUTH)
        assert response.status_code in (404, 422), (name, response.status_code)
    assert stored(agent) == before and not leftovers(agent)
    assert not any(p.name == "passwd" for p in agent.data_dir.rglob("*"))


def test_malformed_and_invalid_jobs_are_refused(agent, model):
    with agent.client() as client:
        sha = client.upload(model)
        before = len(client.jobs())
    for body in (b"{not json", b"[]", b'{"artifact": "%s", "bogus": 1}' % sha.encode(),
                 b'{"artifact": "%s", "iterations": 10, "duration_s": 1}' % sha.encode(),
                 b'{"artifact": "%s", "batch_sizes": [0]}' % sha.encode(),
                 b'{"artifact": "%s", "runtime": "tflite"}' % sha.encode(),
                 b'{"artifact": "%s", "dla_core": 0}' % sha.encode()):
        response = httpx.post(f"{agent.url}/v1/jobs", content=body,
                              headers={**AUTH, "Content-Type": "application/json"})
        assert response.status_code == 422, (body, response.text)
    response = httpx.post(f"{agent.url}/v1/jobs", json={"artifact": "0" * 64}, headers=AUTH)
    assert response.status_code == 404 and "upload it first" in response.json()["detail"]
    with agent.client() as client:
        assert len(client.jobs()) == before


def test_a_job_measures_and_reports_with_units(agent, model):
    with agent.client() as client:
        sha = client.upload(model)
        assert client.upload(model) == sha, "a second upload of the same bytes is a no-op"
        seen = []
        job = client.wait(client.submit({"artifact": sha, **QUICK})["id"], timeout_s=120, on_progress=seen.append)
    assert job["state"] == "succeeded", job["error"]
    states = [j["state"] for j in seen]
    assert states[-1] == "succeeded" and set(states) <= {"queued", "running", "succeeded"}
    result = job["result"]
    assert result["schema"] == RESULT_SCHEMA and result["input_chw"] == [3, 16, 16]
    assert result["smoke"]["output_shape"] == [1, 10]
    assert [run["batch_size"] for run in result["runs"]] == [1, 4]
    for run in result["runs"]:
        assert run["iterations"] == 5 and run["images"] == 5 * run["batch_size"]
        assert 0 < run["latency_p50_ms"] <= run["latency_p99_ms"]
        assert run["throughput_images_per_s"] > 0
        assert run["summary"]["peak_memory_mb"] > 10 and run["summary"]["memory_source"] == "host:rss_mb"
        assert run["summary"]["power_mean_mw"] is None, "no power source on this host: reported as missing"
        assert run["telemetry"]["host"]["samples"] >= 2
    assert result["environment"]["onnxruntime"]


def test_concurrent_clients_poll_while_a_job_runs(agent, model):
    with agent.client() as client:
        sha = client.upload(model)
        job_id = client.submit({"artifact": sha, "duration_s": 2.0, "idle_s": 0, "telemetry": ["host"]})["id"]
    failures, observations = [], []

    def poll():
        try:
            with agent.client() as client:
                while True:
                    job = client.job(job_id)
                    observations.append(job["state"])
                    client.jobs()
                    httpx.get(f"{agent.url}/v1/health").raise_for_status()
                    if job["state"] not in ("queued", "running"):
                        return
                    time.sleep(0.05)
        except Exception as err:  # collected, then asserted on the test thread
            failures.append(err)

    threads = [threading.Thread(target=poll) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert "running" in observations and observations.count("succeeded") == 6


def test_crash_and_hang_fail_only_their_job(agent, model):
    with agent.client() as client:
        sha = client.upload(model)
        crash = client.submit({"artifact": sha, **QUICK, "label": "crash-me"})
        hang = client.submit({"artifact": sha, **QUICK, "label": "hang-me", "timeout_s": 4})
        after = client.submit({"artifact": sha, **QUICK})
        crashed = client.wait(crash["id"], timeout_s=120)
        hung = client.wait(hang["id"], timeout_s=120)
        fine = client.wait(after["id"], timeout_s=120)
    assert crashed["state"] == "failed" and "SIGSEGV" in crashed["error"]
    assert hung["state"] == "failed" and "timed out after 4 s" in hung["error"]
    assert fine["state"] == "succeeded"


def test_a_wait_that_runs_out_is_a_job_timeout_not_an_unreachable_agent(agent, model):
    with agent.client() as client:
        sha = client.upload(model)
        hang = client.submit({"artifact": sha, **QUICK, "label": "hang-me", "timeout_s": 300})
        with pytest.raises(JobTimeoutError) as err:
            client.wait(hang["id"], timeout_s=2, poll_s=0.1)
        assert err.value.status != 0, "status 0 means unreachable: deploy took the device for lost"
        assert err.value.job_id == hang["id"] and f"DELETE /v1/jobs/{hang['id']}" in err.value.fix
        assert client.abandon(hang["id"]) == "cancelled on the agent"
        assert client.job(hang["id"])["state"] == "cancelled"
        assert "ended meanwhile" in client.abandon(hang["id"]), "a job that already ended is left as it is"


def test_a_long_poll_is_answered_when_the_job_changes_and_304_when_it_does_not(agent, model):
    """GET /v1/jobs/{id} with the job's ETag as If-None-Match and ``wait``: held until the job changes."""
    with agent.client() as client:
        sha = client.upload(model)
        hang = client.submit({"artifact": sha, **QUICK, "label": "hang-me", "timeout_s": 300})
        queued = client.submit({"artifact": sha, **QUICK})
    url = f"{agent.url}/v1/jobs/{queued['id']}"
    first = httpx.get(url, headers=AUTH)
    etag = first.headers["etag"]
    assert first.status_code == 200 and first.json()["state"] == "queued" and etag.startswith('"')
    assert httpx.get(url, headers={**AUTH, "If-None-Match": etag}).status_code == 304, "a conditional GET"
    started = time.monotonic()
    unchanged = httpx.get(url, params={"wait": 1.0}, headers={**AUTH, "If-None-Match": etag}, timeout=60)
    assert unchanged.status_code == 304 and unchanged.headers["etag"] == etag and not unchanged.content
    assert time.monotonic() - started >= 0.9, "held for its wait although the hung job ahead of it changed"

    cancel = threading.Timer(1.0, lambda: httpx.delete(f"{agent.url}/v1/jobs/{hang['id']}", headers=AUTH))
    cancel.start()
    try:
        changed = httpx.get(url, params={"wait": 30}, headers={**AUTH, "If-None-Match": etag}, timeout=60)
    finally:
        cancel.join()
    assert changed.status_code == 200 and changed.json()["state"] != "queued", "answered when the queue moved"
    assert changed.headers["etag"] != etag
    with agent.client() as client:
        done = client.wait(queued["id"], timeout_s=120)
    assert done["state"] == "succeeded", done["error"]
    final = httpx.get(url, headers=AUTH).headers["etag"]
    started = time.monotonic()
    assert httpx.get(url, params={"wait": 30}, headers={**AUTH, "If-None-Match": final},
                     timeout=60).status_code == 304
    assert time.monotonic() - started < 20, "a finished job cannot change: answered at once, not after 30 s"
    for bad in (-1, 31, "soon"):
        assert httpx.get(url, params={"wait": bad}, headers=AUTH).status_code == 422


def test_wait_polls_an_agent_that_sends_no_etag():
    """An agent from before long polls (no ETag): wait() polls it every poll_s, never sending ``wait``."""
    from device.client import AgentClient

    states, requests = iter(["queued", "running", "running", "succeeded"]), []

    def older_agent(request):
        requests.append(request)
        return httpx.Response(200, json={"id": "j", "state": next(states), "progress": None})

    client = AgentClient("http://agent", TOKEN)
    client._http = httpx.Client(base_url="http://agent", transport=httpx.MockTransport(older_agent))
    started = time.monotonic()
    assert client.wait("j", timeout_s=30, poll_s=0.2)["state"] == "succeeded"
    assert len(requests) == 4 and time.monotonic() - started >= 0.55, "polled at poll_s"
    assert all("wait" not in r.url.params and "if-none-match" not in r.headers for r in requests)


def test_cancel_a_running_job_and_keep_finished_ones(agent, model):
    with agent.client() as client:
        sha = client.upload(model)
        job = client.submit({"artifact": sha, "duration_s": 60, "idle_s": 0, "telemetry": ["host"]})
        deadline = time.monotonic() + 60
        while client.job(job["id"])["progress"] is None or "measuring" not in client.job(job["id"])["progress"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        started = time.monotonic()
        assert client.cancel(job["id"])["state"] == "cancelled"
        assert time.monotonic() - started < 10
        with pytest.raises(AgentError) as err:
            client.cancel(job["id"])
        assert err.value.status == 409 and "results are kept" in err.value.message
        with pytest.raises(AgentError) as err:
            client.job("nope")
        assert err.value.status == 404


def test_metrics_are_prometheus_text(agent, model):
    from prometheus_client.parser import text_string_to_metric_families

    with agent.client() as client:
        client.wait(client.submit({"artifact": client.upload(model), **QUICK})["id"], timeout_s=120)
        families = {family.name: family for family in text_string_to_metric_families(client.metrics())}
    jobs = {sample.labels["state"]: sample.value for sample in families["edgefold_agent_jobs"].samples}
    assert jobs["succeeded"] >= 1 and set(jobs) >= {"queued", "running", "failed", "interrupted", "cancelled"}
    assert families["edgefold_agent_artifacts"].samples[0].value >= 1
    assert families["edgefold_agent_jobs_finished"].type == "counter"
    latencies = families["edgefold_agent_last_latency_p50_seconds"].samples
    assert {s.labels["batch_size"] for s in latencies} == {"1", "4"} and all(s.value > 0 for s in latencies)


def test_openapi_schema_names_every_route(agent):
    schema = httpx.get(f"{agent.url}/openapi.json", headers=AUTH).json()
    assert {"/v1/health", "/v1/device", "/v1/artifacts/{sha256}", "/v1/jobs", "/v1/jobs/{job_id}", "/metrics"} \
        <= set(schema["paths"])
    assert "HTTPBearer" in schema["components"]["securitySchemes"]


@pytest.mark.slow
def test_kill_9_mid_job_loses_nothing(tmp_path, model):
    process = AgentProcess(tmp_path / "data").start()
    try:
        with process.client() as client:
            sha = client.upload(model)
            done = client.wait(client.submit({"artifact": sha, **QUICK})["id"], timeout_s=120)
            assert done["state"] == "succeeded"
            long = client.submit({"artifact": sha, "duration_s": 120, "idle_s": 0, "telemetry": ["host"]})
            queued = client.submit({"artifact": sha, **QUICK, "label": "queued before the crash"})
            deadline = time.monotonic() + 60
            while client.job(long["id"])["state"] != "running" or not client.job(long["id"])["progress"]:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        import sqlite3

        with sqlite3.connect(process.data_dir / "agent.db") as db:
            child_pid = db.execute("SELECT pid FROM jobs WHERE id = ?", (long["id"],)).fetchone()[0]
        assert child_pid
        assert b"device.service.zygote" in open(f"/proc/{child_pid}/cmdline", "rb").read(), "forked by the zygote: found by its cwd"
        process.kill(signal.SIGKILL)
        assert os.path.exists(f"/proc/{child_pid}"), "the orphaned job process outlives a kill -9 of the agent"
        process.start()
        with process.client() as client:
            assert client.job(done["id"]) == done, "a finished job and its result survive unchanged"
            interrupted = client.job(long["id"])
            assert interrupted["state"] == "interrupted" and "submit it again" in interrupted["error"]
            finished = client.wait(queued["id"], timeout_s=120)
            assert finished["state"] == "succeeded" and finished["spec"]["label"] == "queued before the crash"
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{child_pid}") and _state(child_pid) != "Z":
            assert time.monotonic() < deadline, "the orphaned measurement was not stopped after the restart"
            time.sleep(0.1)
    finally:
        process.kill(signal.SIGTERM)


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
def test_sigterm_marks_the_running_job_interrupted_and_keeps_the_queue(tmp_path, model):
    process = AgentProcess(tmp_path / "data").start()
    with process.client() as client:
        sha = client.upload(model)
        long = client.submit({"artifact": sha, "duration_s": 120, "idle_s": 0, "telemetry": ["host"]})
        queued = client.submit({"artifact": sha, **QUICK})
        while client.job(long["id"])["state"] != "running":
            time.sleep(0.1)
        etag = httpx.get(f"{process.url}/v1/jobs/{queued['id']}", headers=AUTH).headers["etag"]
    held = threading.Thread(target=lambda: httpx.get(f"{process.url}/v1/jobs/{queued['id']}", params={"wait": 30},
                                                     headers={**AUTH, "If-None-Match": etag}, timeout=60))
    held.start()
    time.sleep(0.3)
    started = time.monotonic()
    process.kill(signal.SIGTERM)
    held.join(60)
    # uvicorn re-raises the signal after shutting down; a held long poll does not keep it waiting (a SIGKILL after
    # 30 s would show as -9)
    assert process.process.returncode in (0, -signal.SIGTERM) and time.monotonic() - started < 20
    process.start()
    try:
        with process.client() as client:
            stopped = client.job(long["id"])
            assert stopped["state"] == "interrupted" and "the agent was stopped" in stopped["error"], stopped
            assert client.wait(queued["id"], timeout_s=120)["state"] == "succeeded"
    finally:
        process.kill(signal.SIGTERM)


def test_client_upload_matches_file_hash(agent, model):
    with agent.client() as client:
        assert client.upload(model) == sha256_file(model) == hashlib.sha256(model.read_bytes()).hexdigest()
        assert client.has_artifact(sha256_file(model)) and not client.has_artifact("f" * 64)


def test_unreachable_agent_is_a_clear_error():
    from device.client import AgentClient

    with AgentClient("http://127.0.0.1:9", TOKEN, timeout_s=2) as client, pytest.raises(AgentError) as err:
        client.health()
    assert "unreachable" in err.value.message and "edgefold-agent serve" in err.value.fix


def test_a_device_checkpoint_runs_on_the_torch_runner(agent, tmp_path):
    """The default agent's torch road: state and an architecture key, rebuilt by the agent's own registry."""
    torch = pytest.importorskip("torch")
    from pipeline.checkpoint import save_checkpoint
    from pipeline.models import build_model
    from pipeline.tasks.classification.torch_export import write_device_checkpoint

    torch.manual_seed(0)
    checkpoint = save_checkpoint(tmp_path / "m.pt", build_model("tiny_resnet", 5).eval(), "tiny_resnet", 5)
    path = write_device_checkpoint(checkpoint, tmp_path / "m.device.pt", (3, 16, 16))
    with agent.client() as client:
        sha = client.upload(path)
        assert (agent.data_dir / "artifacts" / f"{sha}.device.pt").is_file()
        job = client.wait(client.submit({"artifact": sha, **QUICK, "runtime": "torch"})["id"], timeout_s=180)
    assert job["state"] == "succeeded", job["error"]
    runtime = job["result"]["runtime"]
    assert runtime["device"] == "cpu" and job["result"]["smoke"]["output_shape"] == [1, 5]
    assert runtime["loaded_from"] == {"artifact": "device checkpoint", "arch": "tiny_resnet",
                                      "architecture": "built-in (test model)"}


def test_incomplete_preprocessing_is_a_422_not_a_500(agent, model):
    # Found by the schemathesis run: {"preprocess": {}} used to escape validation as a KeyError.
    with agent.client() as client:
        sha = client.upload(model)
    for preprocess in ({}, {"input_size": 16}, {"input_size": "x", "resize": 16, "channels": 3, "mean": [0] * 3,
                                                "std": [1] * 3}):
        response = httpx.post(f"{agent.url}/v1/jobs", json={"artifact": sha, "preprocess": preprocess}, headers=AUTH)
        assert response.status_code == 422, (preprocess, response.status_code, response.text)

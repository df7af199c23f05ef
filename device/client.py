"""The Python client of the agent's API v1: upload by hash, submit, wait with progress, fetch.

    with AgentClient("http://jetson:8765", token=open("token").read().strip()) as agent:
        job = agent.benchmark("model.int8.onnx", runtime="tensorrt", precision="int8", batch_sizes=[1, 8])
        print(job["result"]["runs"][0]["latency_p50_ms"])
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import ValidationError

from device.errors import StatusError, require
from device.files import sha256_file
from device.service.problems import describe_problems, field_problems
from device.schema import FINISHED, JobResult, JobSpec

CHUNK = 1 << 20
LONG_POLL_S = 10.0  # the longest a wait() request is held by the agent (its limit: device.service.agent.MAX_WAIT_S)


class AgentError(StatusError):
    """The agent refused a request or could not be reached; ``status`` is the HTTP status (0: unreachable)."""

    default_status = 0


class JobTimeoutError(AgentError):
    """A job still queued or running when :meth:`AgentClient.wait` gave up: the agent answered, the job did not end.

    Not "unreachable" (status 0): the device is fine and only this job is late, so a caller fails
    this job, not the device, and cancels it (:meth:`AgentClient.cancel`): left alone it keeps the
    agent's one-job-at-a-time queue busy. ``status`` is 408, never an answer of the agent.

    Args:
        message: What timed out, and in which state.
        fix: What to do about it.
        status: 408.
        job_id: The job that did not end.
    """

    default_status = 408

    def __init__(self, message: str, fix: str | None = None, status: int | None = None, job_id: str | None = None):
        super().__init__(message, fix, status)
        self.job_id = job_id

    def __reduce__(self):
        return (self.__class__, (self.message, self.fix, self.status, self.job_id))


def read_token(token: str | None = None, token_file: str | os.PathLike | None = None) -> str:
    """A token given directly, from a file, or from ``$EDGEFOLD_AGENT_TOKEN``."""
    if token:
        return token
    if token_file:
        try:
            return Path(token_file).expanduser().read_text().strip()
        except OSError as err:
            raise AgentError(f"cannot read the agent token file {token_file}: {err.strerror}",
                             fix="copy the agent's token file (its --token-file, or DATA_DIR/token) here") from None
    if os.environ.get("EDGEFOLD_AGENT_TOKEN"):
        return os.environ["EDGEFOLD_AGENT_TOKEN"]
    raise AgentError("no agent token", fix="pass a token file, or set EDGEFOLD_AGENT_TOKEN")


class AgentClient:
    """A client of one agent.

    Args:
        url: The agent's base URL (``http://host:8765``).
        token: Its bearer token.
        timeout_s: Per-request timeout (uploads stream, so this bounds each read/write, not the upload).
    """

    def __init__(self, url: str, token: str, timeout_s: float = 30.0):
        httpx = require("httpx", "httpx", "pip install 'edgefold[device]'")
        self.url = url.rstrip("/")
        self._httpx = httpx
        self._timeout_s = timeout_s
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {token}"})

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any):
        try:
            response = self._http.request(method, path, **kwargs)
        except self._httpx.TransportError as err:
            raise AgentError(f"agent {self.url} is unreachable: {type(err).__name__}: {err}",
                             fix="start it (edgefold-agent serve, or systemctl start edgefold-agent) and check the "
                                 "URL and firewall") from None
        if response.status_code >= 400:
            try:
                body = response.json()
                detail, fix = body.get("detail"), body.get("fix")
            except ValueError:
                detail, fix = response.text[:500], None
            if response.status_code == 401:
                fix = fix or "use the agent's token (its --token-file, or DATA_DIR/token on the device)"
            raise AgentError(f"agent {self.url} answered {response.status_code} to {method} {path}: {detail}",
                             fix=fix, status=response.status_code)
        return response

    # ----------------------------------------------------------------- API
    def health(self) -> dict[str, Any]:
        return self._request("GET", "/v1/health").json()

    def device(self) -> dict[str, Any]:
        return self._request("GET", "/v1/device").json()

    def has_artifact(self, sha256: str) -> bool:
        try:
            self._request("GET", f"/v1/artifacts/{sha256}")
            return True
        except AgentError as err:
            if err.status == 404:
                return False
            raise

    def upload(self, path: str | os.PathLike) -> str:
        """Uploads ``path`` unless the agent already holds its bytes; returns its sha256."""
        sha256 = sha256_file(path)
        if self.has_artifact(sha256):
            return sha256

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(CHUNK), b""):
                    yield block

        self._request("PUT", f"/v1/artifacts/{sha256}", content=chunks(),
                      headers={"Content-Type": "application/octet-stream",
                               "Content-Length": str(os.path.getsize(path))})
        return sha256

    def submit(self, spec: JobSpec | dict[str, Any]) -> dict[str, Any]:
        """Queues a job; a spec the agent would refuse is refused here first (AgentError, status 422)."""
        if not isinstance(spec, JobSpec):
            try:  # through JSON, as the agent sees it: tuples pass as lists, NaN and "1" for 1 do not
                spec = JobSpec.model_validate_json(json.dumps(spec))
            except (ValidationError, TypeError, ValueError) as err:
                problems = describe_problems(field_problems(err.errors())) if isinstance(err, ValidationError) \
                    else str(err)
                raise AgentError(f"invalid job spec: {problems}", fix="correct the named fields (see device.schema."
                                                                      "JobSpec)", status=422) from None
        return self._request("POST", "/v1/jobs", json=spec.model_dump(exclude_none=True)).json()

    @staticmethod
    def result(job: dict[str, Any]) -> JobResult:
        """A finished job's result, typed (:class:`device.schema.JobResult`); another version's is refused.

        Raises:
            SchemaVersionError: The agent writes another result schema (upgrade one side).
            ResultError: The job has no result, or one that does not fit the schema.
        """
        from device.schema import parse_result

        return parse_result(job.get("result"), f"job {job.get('id')}'s result")

    def job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{job_id}").json()

    def jobs(self, state: str | None = None) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/jobs", params={"state": state} if state else None).json()

    def engine(self, key: str) -> dict[str, Any]:
        """An engine the agent built (``GET /v1/engines/{key}``): its build, fingerprint, file, size and sha256."""
        return self._request("GET", f"/v1/engines/{key}").json()

    def engine_file(self, key: str, path: str | os.PathLike) -> Path:
        """Downloads an engine's bytes to ``path`` and checks them against the sha256 the agent gives.

        Raises:
            ResultError: The bytes do not hash to it (refused with both hashes; nothing is left at ``path``).
        """
        import hashlib

        from device.errors import ResultError

        expected = self.engine(key)["sha256"]
        blob = self._request("GET", f"/v1/engines/{key}/file").content
        actual = hashlib.sha256(blob).hexdigest()
        if actual != expected:
            raise ResultError(f"engine {key}'s bytes hash to sha256 {actual}, not {expected} as the agent says",
                              fix="fetch it again (edgefold ship)")
        Path(path).write_bytes(blob)
        return Path(path)

    def tensors(self, job: dict[str, Any]) -> dict[str, Any]:
        """A finished debug job's marked tensors by name, checked against the sha256 its result records.

        Raises:
            ResultError: The bytes do not hash to the recorded sha256 (refused with both hashes).
        """
        import hashlib

        from device.jobs.debug_tensors import read_tensors
        from device.errors import ResultError

        diverge = self.result(job).diverge
        if diverge is None:
            raise ResultError(f"job {job.get('id')} is no debug job", fix="submit a JobSpec with diverge")
        blob = self._request("GET", f"/v1/jobs/{job['id']}/tensors").content
        actual = hashlib.sha256(blob).hexdigest()
        if actual != diverge.sha256:
            raise ResultError(f"job {job['id']}'s tensors hash to sha256 {actual}, not {diverge.sha256} as its result "
                              "says", fix="fetch them again; if it persists, run the debug job again")
        return read_tensors(blob, [tensor.name for tensor in diverge.tensors])

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/v1/jobs/{job_id}").json()

    def abandon(self, job_id: str) -> str:
        """Cancels a job its caller stopped waiting for (a :class:`JobTimeoutError`); never raises.

        Returns:
            What became of the job, to append to the caller's error ("cancelled on the agent", …).
        """
        try:
            self.cancel(job_id)
            return "cancelled on the agent"
        except AgentError as err:
            if err.status == 409:  # it ended between the last poll and the cancel
                return "it ended meanwhile; the agent keeps its result"
            return f"not cancelled ({err.message}): cancel it by hand, DELETE /v1/jobs/{job_id}"

    def metrics(self) -> str:
        return self._request("GET", "/metrics").text

    def wait(self, job_id: str, timeout_s: float = 3600.0, poll_s: float = 0.5,
             on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Waits until the job finishes; ``on_progress`` sees each change of state or progress.

        Long-polls: each request is held by the agent until the job changes (its ETag), so a finished job is
        seen at once and an idle wait costs one request per :data:`LONG_POLL_S`. An agent that sends no ETag
        (before long polls) is polled every ``poll_s`` seconds instead.

        Raises:
            JobTimeoutError: When ``timeout_s`` passes first; the job goes on on the agent until cancelled.
            AgentError: When the agent refuses or cannot be reached.
        """
        deadline = time.monotonic() + timeout_s
        seen, job, etag = None, None, None
        while True:
            remaining = deadline - time.monotonic()
            if etag is None:
                response = self._request("GET", f"/v1/jobs/{job_id}")
            else:  # held until the job changes; within this client's read timeout
                hold = max(0.0, min(LONG_POLL_S, self._timeout_s / 2, remaining))
                response = self._request("GET", f"/v1/jobs/{job_id}", params={"wait": f"{hold:.3f}"},
                                         headers={"If-None-Match": etag})
            if response.status_code != 304:  # 304: unchanged, the job we hold is still the job
                job, etag = response.json(), response.headers.get("etag")
                marker = (job["state"], job.get("progress"))
                if on_progress and marker != seen:
                    on_progress(job)
                    seen = marker
                if job["state"] in FINISHED:
                    return job
            if time.monotonic() > deadline:
                raise JobTimeoutError(
                    f"job {job_id} on {self.url} still {job['state']} after waiting {timeout_s:g} s",
                    fix=f"cancel it (AgentClient.cancel, DELETE /v1/jobs/{job_id}): it holds the agent's queue; a "
                        f"hung runtime shows in the agent's DATA_DIR/jobs/{job_id}/log.txt, a slow model needs a "
                        "longer timeout (deploy.job_timeout_s)", job_id=job_id)
            if etag is None:
                time.sleep(poll_s)

    def benchmark(self, path: str | os.PathLike, timeout_s: float = 3600.0, verbose: bool = False,
                  **spec: Any) -> dict[str, Any]:
        """Uploads, submits and waits; returns the finished job (check its ``state``).

        Raises:
            JobTimeoutError: The job did not end within ``timeout_s``; it was cancelled on the agent.
        """
        sha256 = self.upload(path)
        job = self.submit({"artifact": sha256, **spec})
        report = (lambda j: print(f"  {self.url} job {j['id']}: {j['state']}"
                                  f"{' — ' + j['progress'] if j.get('progress') else ''}", file=sys.stderr)) \
            if verbose else None
        try:
            return self.wait(job["id"], timeout_s=timeout_s, on_progress=report)
        except JobTimeoutError as err:  # nobody waits for it any more: it must not hold the agent's queue
            raise JobTimeoutError(f"{err.message}; {self.abandon(job['id'])}", fix=err.fix, job_id=err.job_id) from None

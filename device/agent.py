"""The agent daemon's HTTP API v1 (FastAPI), served by uvicorn through ``edgefold-agent serve``.

Every route but ``/v1/health`` needs ``Authorization: Bearer <token>`` (compared in constant time).
Refused requests change nothing: an upload is verified in a temporary file before it is stored;
a job is validated before it is queued.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import fastapi
import yaml
from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from device import __version__
from device.artifacts import ArtifactError, HashingWriter, check
from device.errors import ConfigError, EdgeFoldError, StatusError, require
from device.executor import Executor
from device.info import describe_device
from device.schema import FINISHED, SHA256, Artifact, ErrorBody, Health, Job, JobSpec, JobState
from device.store import Store

log = logging.getLogger("edgefold.agent")
TOKEN_ENV = "EDGEFOLD_AGENT_TOKEN"


class AgentConfig(BaseModel):
    """The agent's settings (a YAML file through ``--config``; command-line flags win)."""

    model_config = ConfigDict(extra="forbid")
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    data_dir: Path = Path("~/.local/share/edgefold-agent")
    token_file: Path | None = None
    max_upload_mib: int = Field(1024, ge=1)
    job_timeout_s: float = Field(1800.0, gt=0)
    jtop_socket: str = "/run/jtop.sock"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @classmethod
    def load(cls, path: str | os.PathLike | None, **overrides: Any) -> "AgentConfig":
        data: dict[str, Any] = {}
        if path is not None:
            try:
                data = yaml.safe_load(Path(path).read_text()) or {}
            except OSError as err:
                raise ConfigError(f"cannot read the agent config {path}: {err.strerror}") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{path} must hold a mapping of settings")
        data.update({k: v for k, v in overrides.items() if v is not None})
        try:
            config = cls.model_validate(data)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise ConfigError(f"invalid agent config: {problems}",
                              fix=f"allowed keys: {', '.join(cls.model_fields)}") from None
        config.data_dir = config.data_dir.expanduser()
        return config


def load_token(config: AgentConfig) -> str:
    """The bearer token: ``token_file``, else ``$EDGEFOLD_AGENT_TOKEN``, else one generated in the data dir."""
    if config.token_file is not None:
        try:
            token = config.token_file.expanduser().read_text().strip()
        except OSError as err:
            raise ConfigError(f"cannot read the token file {config.token_file}: {err.strerror}",
                              fix="create it: python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE; "
                                  "chmod 600 FILE") from None
        if len(token) < 16:
            raise ConfigError(f"the token in {config.token_file} is shorter than 16 characters",
                              fix="use a random token: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        return token
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    path = config.data_dir / "token"
    if not path.is_file():
        config.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
        log.warning("generated a bearer token in %s (clients need it)", path)
    return path.read_text().strip()


class Metrics:
    """Prometheus text exposition of the agent's state, rendered on each scrape."""

    def __init__(self, store: Store, executor: Executor, started: float):
        self.store, self.executor, self.started = store, executor, started
        self.last_result: dict[str, Any] | None = None

    def render(self) -> str:
        counts = self.store.counts()
        artifacts, artifact_bytes = self.store.artifact_totals()
        lines = [
            "# HELP edgefold_agent_info The agent's version.", "# TYPE edgefold_agent_info gauge",
            f'edgefold_agent_info{{version="{__version__}"}} 1',
            "# HELP edgefold_agent_uptime_seconds Seconds since the agent started.",
            "# TYPE edgefold_agent_uptime_seconds gauge", f"edgefold_agent_uptime_seconds {time.time() - self.started:.3f}",
            "# HELP edgefold_agent_jobs Jobs in the database by state.", "# TYPE edgefold_agent_jobs gauge",
        ]
        for state in ("queued", "running", *FINISHED):
            lines.append(f'edgefold_agent_jobs{{state="{state}"}} {counts.get(state, 0)}')
        lines += ["# HELP edgefold_agent_jobs_finished_total Jobs finished since the agent started, by state.",
                  "# TYPE edgefold_agent_jobs_finished_total counter"]
        for state in FINISHED:
            lines.append(f'edgefold_agent_jobs_finished_total{{state="{state}"}} '
                         f'{self.executor.finished_total.get(state, 0)}')
        lines += ["# HELP edgefold_agent_artifacts Artifacts stored.", "# TYPE edgefold_agent_artifacts gauge",
                  f"edgefold_agent_artifacts {artifacts}",
                  "# HELP edgefold_agent_artifact_bytes Bytes of stored artifacts.",
                  "# TYPE edgefold_agent_artifact_bytes gauge", f"edgefold_agent_artifact_bytes {artifact_bytes}"]
        latest = self.store.list(state="succeeded", limit=1)
        if latest and latest[0].result:
            job = latest[0]
            latency, power = [], []
            for run in job.result.get("runs", []):
                labels = f'job="{job.id}",runtime="{job.spec.runtime}",batch_size="{run["batch_size"]}"'
                latency.append(f"edgefold_agent_last_latency_p50_seconds{{{labels}}} {run['latency_p50_ms'] / 1e3:.6g}")
                if run.get("summary", {}).get("power_mean_mw") is not None:
                    power.append(f"edgefold_agent_last_power_mean_watts{{{labels}}} "
                                 f"{run['summary']['power_mean_mw'] / 1e3:.6g}")
            # A family's samples must be contiguous in the text format.
            lines += ["# HELP edgefold_agent_last_latency_p50_seconds Latency p50 of the last succeeded job.",
                      "# TYPE edgefold_agent_last_latency_p50_seconds gauge", *latency,
                      "# HELP edgefold_agent_last_power_mean_watts Mean power of the last succeeded job's window.",
                      "# TYPE edgefold_agent_last_power_mean_watts gauge", *power]
        return "\n".join(lines) + "\n"


def create_app(config: AgentConfig, token: str | None = None, child_env: dict[str, str] | None = None):
    """The FastAPI application (its executor starts and stops with the app's lifespan).

    Its routes are closures over this agent's store and executor, so one process can host several
    agents (the tests and the pipeline's loopback agents do).

    Args:
        config: Agent settings.
        token: The bearer token (default: :func:`load_token`).
        child_env: Extra environment for job processes.
    """
    token = token or load_token(config)
    store = Store(config.data_dir)
    executor = Executor(store, job_timeout_s=config.job_timeout_s, jtop_socket=config.jtop_socket, env=child_env)
    started = time.time()
    metrics = Metrics(store, executor, started)
    device_cache: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app):
        executor.start()
        log.info("edgefold-agent %s: data in %s", __version__, config.data_dir)
        yield
        await run_in_threadpool(executor.stop)

    app = FastAPI(title="EdgeFold agent", version=__version__, lifespan=lifespan,
                  description="Builds and benchmarks models on this device; measures latency, memory and power.")
    bearer = HTTPBearer(auto_error=False, description="the agent's token (its --token-file)")

    def authorized(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        supplied = credentials.credentials if credentials else ""
        if not hmac.compare_digest(supplied.encode(), token.encode()):
            raise fastapi.HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(EdgeFoldError)
    async def edgefold_error(request: Request, err: EdgeFoldError):
        status = err.status if isinstance(err, StatusError) else 400
        return JSONResponse(status_code=status, content={"detail": err.message, "fix": err.fix})

    errors = {401: {"model": ErrorBody}, 404: {"model": ErrorBody}}
    auth = [Depends(authorized)]

    @app.get("/v1/health", response_model=Health, tags=["agent"])
    def health() -> Health:
        counts = store.counts()
        return Health(status="ok", version=__version__, uptime_s=time.time() - started,
                      queued=counts.get("queued", 0), running=counts.get("running", 0))

    @app.get("/v1/device", dependencies=auth, responses=errors, tags=["agent"])
    def device() -> dict[str, Any]:
        """Board, L4T/JetPack, GPU, CUDA, TensorRT/ONNX Runtime/torch versions, nvpmodel and jetson_clocks."""
        if not device_cache or time.time() - device_cache["at"] > 60:
            device_cache.update(info=describe_device(), at=time.time())
        return device_cache["info"]

    sha_param = PathParam(pattern=SHA256.pattern, description="lowercase hex sha256 of the artifact's bytes")

    @app.put("/v1/artifacts/{sha256}", response_model=Artifact, status_code=201, dependencies=auth,
             responses={**errors, 400: {"model": ErrorBody}, 413: {"model": ErrorBody}, 422: {"model": ErrorBody}},
             tags=["artifacts"],
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    async def put_artifact(request: Request, sha256: str = sha_param) -> Artifact:
        """Streams an ONNX model (or torch.export archive) in; stored only if its bytes hash to ``sha256``."""
        limit = config.max_upload_mib << 20
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ArtifactError(f"upload of {int(declared)} bytes exceeds the agent's limit of "
                                f"{config.max_upload_mib} MiB", fix="raise max_upload_mib in the agent's config",
                                status=413)
        tmp = store.temp_file()
        writer = HashingWriter(tmp, limit)
        try:
            async for chunk in request.stream():
                writer.write(chunk)
            writer.close()
            kind = await run_in_threadpool(check, tmp, sha256, writer.digest.hexdigest(), writer.size)
            return store.add_artifact(sha256, kind, tmp)
        finally:
            writer.close()
            tmp.unlink(missing_ok=True)

    @app.get("/v1/artifacts/{sha256}", response_model=Artifact, dependencies=auth, responses=errors,
             tags=["artifacts"])
    def get_artifact(sha256: str = sha_param) -> Artifact:
        found = store.get_artifact(sha256)
        if found is None:
            raise fastapi.HTTPException(404, f"no artifact {sha256}")
        return found[0]

    @app.post("/v1/jobs", response_model=Job, status_code=201, dependencies=auth, responses=errors, tags=["jobs"])
    def submit(spec: JobSpec) -> Job:
        """Queues a benchmark of an uploaded artifact; jobs run one at a time, in submission order."""
        if store.get_artifact(spec.artifact) is None:
            raise fastapi.HTTPException(404, f"no artifact {spec.artifact}; upload it first with "
                                             f"PUT /v1/artifacts/{spec.artifact}")
        job = store.submit(spec)
        executor.wake()
        return job

    @app.get("/v1/jobs", response_model=list[Job], dependencies=auth, responses=errors, tags=["jobs"])
    def list_jobs(state: JobState | None = None, limit: int = Query(100, ge=1, le=1000)) -> list[Job]:
        return store.list(state=state, limit=limit)

    @app.get("/v1/jobs/{job_id}", response_model=Job, dependencies=auth, responses=errors, tags=["jobs"])
    def get_job(job_id: str) -> Job:
        job = store.get(job_id)
        if job is None:
            raise fastapi.HTTPException(404, f"no job {job_id!r}")
        return job

    @app.delete("/v1/jobs/{job_id}", response_model=Job, dependencies=auth,
                responses={**errors, 409: {"model": ErrorBody}}, tags=["jobs"])
    def cancel(job_id: str) -> Job:
        """Cancels a queued or running job. A finished job and its result are kept (409)."""
        job = store.get(job_id)
        if job is None:
            raise fastapi.HTTPException(404, f"no job {job_id!r}")
        if not executor.cancel(job_id):
            raise fastapi.HTTPException(409, f"job {job_id} already {store.get(job_id).state}; results are kept")
        return store.get(job_id)

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=auth, responses=errors, tags=["agent"])
    def prometheus() -> PlainTextResponse:
        """Prometheus metrics (text format 0.0.4); scrape with ``authorization: {credentials_file: …}``."""
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    app.state.store, app.state.executor, app.state.config = store, executor, config
    return app


def serve(config: AgentConfig) -> None:
    """Runs the agent with uvicorn until SIGINT/SIGTERM."""
    uvicorn = require("uvicorn", "uvicorn", "pip install 'edgefold[device]'")
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_app(config)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, access_log=False)

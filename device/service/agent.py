"""The agent daemon's HTTP API v1 (FastAPI), served by uvicorn through ``edgefold-agent serve``.

Every route but ``/v1/health`` needs ``Authorization: Bearer <token>`` (compared in constant time),
the API's own description included: ``/openapi.json`` takes the token, and the ``/docs`` and
``/redoc`` pages are served only with ``public_docs: true`` in the agent's config.
Refused requests change nothing: an upload is verified in a temporary file before it is stored;
a job is validated before it is queued. A refusal is always a 4xx with an :class:`ErrorBody` that
JSON can carry: what the client sent is named, never echoed (it may be NaN or a lone surrogate).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import sqlite3
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import fastapi
import yaml
from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from device import __version__
from device.uploads.artifacts import ArtifactError, HashingWriter, check
from device.errors import ConfigError, EdgeFoldError, StatusError, require
from device.service.executor import Executor
from device.info import describe_device, jtop_banner, jtop_status, runtime_banner
from device.power.power_modes import DEFAULT_CONF
from device.service.problems import describe_problems, field_problems, safe_text
from device.schema import FINISHED, SHA256, Artifact, ErrorBody, Health, Job, JobSpec, JobState
from device.service.store import Store

log = logging.getLogger("edgefold.agent")
TOKEN_ENV = "EDGEFOLD_AGENT_TOKEN"
MAX_WAIT_S = 30.0  # the longest long poll (GET /v1/jobs/{id}?wait=); a client's read timeout must exceed it
LONG_POLL_TICK_S = 0.05
STARTUP_FAILURE = 3  # uvicorn's exit status when the server never started
MAX_JOB_BYTES = 64 << 10  # a job spec is well under 2 KiB; more is a mistake or an attack, refused unread (413)


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
    nvpmodel_conf: str = Field(DEFAULT_CONF, description="the board's nvpmodel configuration: a sweep checks that "
                                                         "each mode took effect against its caps and online cores")
    thermal_dir: str = Field("/sys/devices/virtual/thermal", description="the kernel's thermal zones: a sustained "
                                                                         "job reads their trip points")
    thermal_margin_c: float = Field(5.0, ge=0, le=50, description="a sustained job stops when a zone comes within "
                                                                  "this of its critical trip point")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    public_docs: bool = Field(False, description="serve /docs, /redoc and /openapi.json without the token")
    trust_programs: bool = Field(False, description="accept torch.export programs (.pt2): loading one makes torch "
                                                    "generate Python from the file and run it, so with this on any "
                                                    "holder of the token can run code on the device; off, the device "
                                                    "takes data only (ONNX, device checkpoints, tensors, sidecars)")
    fork_jobs: bool = Field(True, description="fork each job from a warm parent that has imported what jobs import "
                                              "(device.service.launcher; about 47 MB resident while idle, on x86); false starts "
                                              "each job as a fresh process")

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


def submittable(store: Store, spec: JobSpec, job_timeout_s: float) -> None:
    """A job the agent can run: its artifact uploaded (else 404), a sustained run within its effective timeout (the
    job's own ``timeout_s``, else the agent's ``job_timeout_s``; else 422)."""
    if store.get_artifact(spec.artifact) is None:
        raise fastapi.HTTPException(404, f"no artifact {spec.artifact}; upload it first with "
                                         f"PUT /v1/artifacts/{spec.artifact}")
    timeout_s = spec.timeout_s or job_timeout_s
    settings, settle_s = spec.sustained_settings()  # a sweep of "all" modes: one here, all counted by the job
    if spec.sustained is not None and spec.sustained.budget_s(settings or 1, settle_s) > timeout_s:
        raise fastapi.HTTPException(422, f"{spec.sustained.budget_text(settings or 1, settle_s)} is past the job's "
                                         f"effective timeout {timeout_s:g} s (the agent's job_timeout_s): run shorter, "
                                         "or give the job a timeout_s or the agent a job_timeout_s above it")


def load_token(config: AgentConfig) -> str:
    """The bearer token: ``token_file``, else ``$EDGEFOLD_AGENT_TOKEN``, else one generated in the data dir."""
    if config.token_file is not None:
        try:
            token = config.token_file.expanduser().read_text().strip()
        except OSError as err:
            raise ConfigError(f"cannot read the token file {config.token_file}: {err.strerror}",
                              fix="create it: python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE; "
                                  "chmod 600 FILE") from None
        mode = config.token_file.expanduser().stat().st_mode
        if mode & 0o077:
            log.warning("the token file %s can be read by other users (mode %o): chmod 600 %s", config.token_file,
                        mode & 0o777, config.token_file)
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
    """Prometheus exposition of the agent's state, collected on each scrape (a ``prometheus_client`` collector).

    A registry of its own per app, not the library's global one: two apps in one process (the tests, a
    loopback agent beside the pipeline) must not share or collide on metric names.
    """

    def __init__(self, store: Store, executor: Executor, started: float):
        self.store, self.executor, self.started = store, executor, started
        self.last_result: dict[str, Any] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self):
        """Yields the metric families; called by the registry on each scrape."""
        info = GaugeMetricFamily("edgefold_agent_info", "The agent's version.", labels=["version"])
        info.add_metric([__version__], 1)
        yield info
        yield GaugeMetricFamily("edgefold_agent_uptime_seconds", "Seconds since the agent started.",
                                value=time.time() - self.started)
        counts = self.store.counts()
        jobs = GaugeMetricFamily("edgefold_agent_jobs", "Jobs in the database by state.", labels=["state"])
        for state in ("queued", "running", *FINISHED):
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        finished = CounterMetricFamily("edgefold_agent_jobs_finished", "Jobs finished since the agent started, by state.",
                                       labels=["state"])
        for state in FINISHED:
            finished.add_metric([state], self.store.finished_total.get(state, 0))
        yield finished
        artifacts, artifact_bytes = self.store.artifact_totals()
        yield GaugeMetricFamily("edgefold_agent_artifacts", "Artifacts stored.", value=artifacts)
        yield GaugeMetricFamily("edgefold_agent_artifact_bytes", "Bytes of stored artifacts.", value=artifact_bytes)
        latest = self.store.list(state="succeeded", limit=1)
        if latest and latest[0].result and latest[0].spec is not None:
            job = latest[0]
            labels = ["job", "runtime", "batch_size"]
            latency = GaugeMetricFamily("edgefold_agent_last_latency_p50_seconds",
                                        "Latency p50 of the last succeeded job.", labels=labels)
            power = GaugeMetricFamily("edgefold_agent_last_power_mean_watts",
                                      "Mean power of the last succeeded job's window.", labels=labels)
            for run in job.result.get("runs", []):
                try:  # a result is the child's output: one the scrape cannot read is left out, not a 500
                    values = [job.id, job.spec.runtime, str(int(run["batch_size"]))]
                    latency.add_metric(values, float(run["latency_p50_ms"]) / 1e3)
                    if (run.get("summary") or {}).get("power_mean_mw") is not None:
                        power.add_metric(values, float(run["summary"]["power_mean_mw"]) / 1e3)
                except (KeyError, TypeError, ValueError, AttributeError):
                    continue
            yield latency
            yield power

    def render(self) -> str:
        """The text exposition format 0.0.4 (what Prometheus scrapes by default)."""
        return generate_latest(self.registry).decode()


class PostBodyLimit:
    """Refuses a POST body over ``limit`` bytes with a JSON 413, before it is read whole.

    Uploads (PUT) have their own cap; a POST carries a job spec of well under 2 KiB. A pure ASGI
    middleware, so a declared oversized body is refused unread and a streamed one once it passes
    the limit.
    """

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def _refusal(self) -> JSONResponse:
        return JSONResponse(status_code=413, content={
            "detail": f"request body over {self.limit} bytes", "fix": "send a job spec (a small JSON object)"})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await self._refusal()(scope, receive, send)
        received = 0

        async def limited():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # FastAPI re-raises an HTTPException met while reading the body; the handler makes it JSON.
                    raise StarletteHTTPException(413, f"request body over {self.limit} bytes")
            return message

        await self.app(scope, limited, send)


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
    executor = Executor(store, job_timeout_s=config.job_timeout_s, jtop_socket=config.jtop_socket, env=child_env,
                        nvpmodel_conf=config.nvpmodel_conf, use_zygote=config.fork_jobs,
                        thermal=(config.thermal_dir, config.thermal_margin_c), trust_programs=config.trust_programs)
    started = time.time()
    metrics = Metrics(store, executor, started)
    device_cache: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app):
        executor.start()
        log.info("edgefold-agent %s: data in %s", __version__, config.data_dir)
        yield
        await run_in_threadpool(executor.stop)

    docs = {} if config.public_docs else {"openapi_url": None, "docs_url": None, "redoc_url": None}
    app = FastAPI(title="EdgeFold agent", version=__version__, lifespan=lifespan, **docs,
                  description="Builds and benchmarks models on this device; measures latency, memory and power.")
    bearer = HTTPBearer(auto_error=False, description="the agent's token (its --token-file)")
    app.add_middleware(PostBodyLimit, limit=MAX_JOB_BYTES)

    def authorized(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        supplied = credentials.credentials if credentials else ""
        if not hmac.compare_digest(supplied.encode(), token.encode()):
            raise fastapi.HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(EdgeFoldError)
    async def edgefold_error(request: Request, err: EdgeFoldError):
        status = err.status if isinstance(err, StatusError) else 400
        return JSONResponse(status_code=status, content={"detail": safe_text(err.message, 4000),
                                                         "fix": safe_text(err.fix) if err.fix else None})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError):
        # FastAPI's own handler echoes each field's input, which JSON cannot always carry (NaN,
        # lone surrogates): that turned refusals into 500s. Name the fields, never the values.
        problems = field_problems(err.errors())
        return JSONResponse(status_code=422, content={
            "detail": safe_text(f"invalid request: {describe_problems(problems)}", 4000),
            "fix": "correct the named fields: numbers as finite JSON numbers (not strings), no unknown keys; "
                   "the schema is GET /openapi.json (with the token)",
            "errors": problems})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        return JSONResponse(status_code=err.status_code, content={"detail": safe_text(err.detail, 4000)},
                            headers=getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception):
        # A bug, never a client's mistake: still a JSON body, and the daemon goes on serving.
        log.error("unexpected %s on %s %s", type(err).__name__, request.method, safe_text(request.url.path, 200),
                  exc_info=err)
        return JSONResponse(status_code=500, content={
            "detail": f"internal error ({type(err).__name__}); the agent keeps running",
            "fix": "report it with the agent's log (journalctl -u edgefold-agent)"})

    errors = {401: {"model": ErrorBody}, 404: {"model": ErrorBody}, 422: {"model": ErrorBody}}
    auth = [Depends(authorized)]

    @app.get("/v1/health", response_model=Health, responses={503: {"model": Health}}, tags=["agent"])
    def health(response: Response) -> Health:
        """``ok``, or 503 ``unhealthy`` when the job executor is not running or the database cannot be read."""
        problems, counts = [], None
        if not executor.alive:
            problems.append("the job executor is not running, so no job will start; restart the agent "
                            "(systemctl restart edgefold-agent) and see its log")
        try:
            counts = store.counts()
        except sqlite3.Error as err:
            problems.append(f"the job database cannot be read: {err}")
        if problems:
            response.status_code = 503
        return Health(status="unhealthy" if problems else "ok", version=__version__, uptime_s=time.time() - started,
                      queued=counts.get("queued", 0) if counts is not None else None,
                      running=counts.get("running", 0) if counts is not None else None,
                      executor_alive=executor.alive, problem="; ".join(problems) or None)

    if not config.public_docs:
        @app.get("/openapi.json", dependencies=[Depends(authorized)], include_in_schema=False)
        def openapi_schema() -> JSONResponse:
            return JSONResponse(app.openapi())

    @app.get("/v1/device", dependencies=auth, responses=errors, tags=["agent"], description=device_facts.__doc__)
    def device() -> dict[str, Any]:
        if not device_cache or time.time() - device_cache["at"] > 60:
            device_cache.update(info=device_facts(config), at=time.time())
        return device_cache["info"]

    sha_param = PathParam(pattern=SHA256.pattern, description="lowercase hex sha256 of the artifact's bytes")

    @app.put("/v1/artifacts/{sha256}", response_model=Artifact, status_code=201, dependencies=auth,
             responses={**errors, 400: {"model": ErrorBody}, 413: {"model": ErrorBody}, 422: {"model": ErrorBody},
                        507: {"model": ErrorBody}},
             tags=["artifacts"],
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    async def put_artifact(request: Request, sha256: str = sha_param) -> Artifact:
        """Streams an artifact in (a torch.export program only with ``--trust-programs``); stored if its bytes hash to
        ``sha256`` and it passes its kind's check."""
        limit = config.max_upload_mib << 20
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ArtifactError(f"upload of {int(declared)} bytes exceeds the agent's limit of "
                                f"{config.max_upload_mib} MiB", fix="raise max_upload_mib in the agent's config",
                                status=413)
        tmp = store.temp_file()
        writer = HashingWriter(tmp, limit)
        try:
            try:
                async for chunk in request.stream():
                    writer.write(chunk)
                writer.close()
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                try:
                    writer.close()
                except OSError:  # its buffer cannot be flushed either
                    pass
                tmp.unlink(missing_ok=True)  # before counting what is free: the partial file is not the agent's
                needed = int(declared) if declared and declared.isdigit() else None
                raise _disk_full(store.root, needed, writer.size) from None
            kind = await run_in_threadpool(check, tmp, sha256, writer.digest.hexdigest(), writer.size, config.trust_programs)
            return store.add_artifact(sha256, kind, tmp)
        finally:
            try:
                writer.close()
            except OSError:  # its buffer still could not be flushed (a full disk): the file is deleted anyway
                pass
            tmp.unlink(missing_ok=True)

    @app.get("/v1/artifacts/{sha256}", response_model=Artifact, dependencies=auth, responses=errors,
             tags=["artifacts"])
    def get_artifact(sha256: str = sha_param) -> Artifact:
        found = store.get_artifact(sha256)
        if found is None:
            raise fastapi.HTTPException(404, f"no artifact {sha256}")
        return found[0]

    @app.post("/v1/jobs", response_model=Job, status_code=201, dependencies=auth,
              responses={**errors, 400: {"model": ErrorBody}, 413: {"model": ErrorBody}}, tags=["jobs"])
    def submit(spec: JobSpec) -> Job:
        """Queues a benchmark of an uploaded artifact; jobs run one at a time, in submission order."""
        submittable(store, spec, config.job_timeout_s)
        job = store.submit(spec)
        executor.wake()
        return job

    @app.get("/v1/jobs", response_model=list[Job], dependencies=auth, responses=errors, tags=["jobs"])
    def list_jobs(state: JobState | None = None, limit: int = Query(100, ge=1, le=1000)) -> list[Job]:
        return store.list(state=state, limit=limit)

    @app.get("/v1/jobs/{job_id}", response_model=Job, dependencies=auth, tags=["jobs"],
             responses={**errors, 304: {"description": "unchanged: the If-None-Match ETag is still the job's (after "
                                                       "waiting up to `wait` seconds for a change)"}})
    async def get_job(request: Request, response: Response, job_id: str,
                      wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S, description=(
                          "with If-None-Match: hold the request up to this many seconds until the job changes "
                          "(state, progress, result), then answer at once (a long poll)")),
                      if_none_match: str | None = Header(None)) -> Job | Response:
        """A job. Its ``ETag`` changes whenever the job does; send it back as ``If-None-Match`` with ``wait``
        to be answered as soon as the job changes (304 when it did not within ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        while True:
            changes = store.job_changes
            job = await run_in_threadpool(store.get, job_id)
            if job is None:
                raise fastapi.HTTPException(404, f"no job {safe_text(job_id, 100)!r}")
            etag = job_etag(job)
            if if_none_match != etag:
                response.headers["ETag"] = etag
                return job
            if job.state in FINISHED or time.monotonic() >= deadline or _exiting(request):
                return Response(status_code=304, headers={"ETag": etag})
            # Compared in memory at 20 Hz: nothing is read from the database until some job changed.
            while store.job_changes == changes and time.monotonic() < deadline and not _exiting(request):
                await asyncio.sleep(LONG_POLL_TICK_S)

    @app.delete("/v1/jobs/{job_id}", response_model=Job, dependencies=auth,
                responses={**errors, 409: {"model": ErrorBody}}, tags=["jobs"])
    def cancel(job_id: str) -> Job:
        """Cancels a queued or running job. A finished job and its result are kept (409)."""
        job = store.get(job_id)
        if job is None:
            raise fastapi.HTTPException(404, f"no job {safe_text(job_id, 100)!r}")
        if not executor.cancel(job_id):
            raise fastapi.HTTPException(409, f"job {job_id} already {store.get(job_id).state}; results are kept")
        return store.get(job_id)

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=auth, responses=errors, tags=["agent"])
    def prometheus() -> PlainTextResponse:
        """Prometheus metrics (text format 0.0.4); scrape with ``authorization: {credentials_file: …}``."""
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.state.store, app.state.executor, app.state.config = store, executor, config
    return add_engine_routes(add_tensors_route(app, store, auth, errors), store, auth, errors)


def add_tensors_route(app: FastAPI, store: Store, auth: list, errors: dict) -> FastAPI:
    """Adds ``GET /v1/jobs/{job_id}/tensors`` (what a debug job, ``JobSpec.diverge``, kept) and returns the app."""
    @app.get("/v1/jobs/{job_id}/tensors", response_class=FileResponse, dependencies=auth, tags=["jobs"],
             responses={**errors, 200: {"content": {"application/octet-stream": {}},
                                        "description": "the debug job's marked tensors (.npz, no pickles); its "
                                                       "sha256 is the result's diverge.sha256"}})
    def job_tensors(job_id: str) -> FileResponse:
        """The marked tensors a debug job (``diverge``) kept, as NumPy's ``.npz``: array ``t<i>`` is the job's
        ``diverge.tensors[i]``, images first."""
        from device.jobs.debug_tensors import TENSORS_FILE

        job = store.get(job_id)
        if job is None:
            raise fastapi.HTTPException(404, f"no job {safe_text(job_id, 100)!r}")
        if job.spec is None or job.spec.diverge is None:
            raise fastapi.HTTPException(404, f"job {job_id} is no debug job: it marked no tensors")
        path = store.job_dir(job_id) / TENSORS_FILE
        if job.state != "succeeded" or not path.is_file():
            raise fastapi.HTTPException(409 if job.state not in FINISHED else 404,
                                        f"job {job_id} is {job.state} and has kept no tensors")
        return FileResponse(path, media_type="application/octet-stream", filename=f"{job_id}-tensors.npz")

    return app


def add_engine_routes(app: FastAPI, store: Store, auth: list, errors: dict) -> FastAPI:
    """Adds ``GET /v1/engines/{key}`` and ``/v1/engines/{key}/file``: an engine this agent built, read-only (engines
    are never accepted into an agent; ``edgefold ship`` fetches one with the build that made it)."""
    from device.runners.engine import ENGINE_FILES, ENGINE_KEY

    key_param = PathParam(pattern=ENGINE_KEY, description="a job result's runtime.built.engines value")

    def held(key: str) -> tuple[Path, Path]:
        folder = store.root / "engines" / key
        engine = next((folder / name for name in ENGINE_FILES if (folder / name).is_file()), None)
        if engine is None or not (folder / "fingerprint.json").is_file():
            raise ArtifactError(f"this agent no longer holds engine {key} (its cache was cleared, or the engine was "
                                "never built here)", fix="rebuild it on the device from the shipped ONNX with the "
                                                         "trtexec line in build.json", status=404)
        return folder, engine

    @app.get("/v1/engines/{key}", dependencies=auth, responses=errors, tags=["engines"])
    def engine_facts(key: str = key_param) -> dict[str, Any]:
        """The build that made an engine (``build.json``: TensorRT version, settings, the trtexec line, DLA layers)
        and the device fingerprint it is bound to; the engine's file name, size and sha256."""
        from device.files import sha256_file

        folder, engine = held(key)
        build = folder / "build.json"
        return {"key": key, "file": engine.name, "size_bytes": engine.stat().st_size, "sha256": sha256_file(engine),
                "fingerprint": json.loads((folder / "fingerprint.json").read_text()),
                "build": json.loads(build.read_text()) if build.is_file() else None}

    @app.get("/v1/engines/{key}/file", response_class=FileResponse, dependencies=auth, tags=["engines"],
             responses={**errors, 200: {"content": {"application/octet-stream": {}},
                                        "description": "the serialized engine: it runs only on the fingerprint "
                                                       "GET /v1/engines/{key} names"}})
    def engine_file(key: str = key_param) -> FileResponse:
        """The engine's bytes (a TensorRT plan, or Torch-TensorRT's compiled program)."""
        _, engine = held(key)
        return FileResponse(engine, media_type="application/octet-stream", filename=f"{key}-{engine.name}")

    return app


def device_facts(config: AgentConfig) -> dict[str, Any]:
    """``GET /v1/device``: board, L4T/JetPack, GPU, CUDA, TensorRT/ONNX Runtime/torch versions, nvpmodel and
    jetson_clocks, ``architectures`` (the sources this device can rebuild a device checkpoint's module from); on a
    Jetson ``jtop``: the jtop service's and client's jetson-stats versions and whether the service accepts the client;
    ``trust_programs``: whether ``.pt2`` uploads are accepted."""
    return {**describe_device(), "jtop": jtop_status(config.jtop_socket), "trust_programs": config.trust_programs}


def job_etag(job: Job) -> str:
    """A strong ETag of the job as served: it changes with its state, progress, error and result."""
    return '"' + hashlib.sha256(job.model_dump_json().encode()).hexdigest()[:32] + '"'


def _exiting(request: Request) -> bool:
    """Whether uvicorn is shutting down: a held long poll answers then, or shutdown would wait it out."""
    server = getattr(request.app.state, "server", None)
    return bool(server is not None and server.should_exit)


def _disk_full(data_dir: Path, needed: int | None, written: int) -> ArtifactError:
    """507 Insufficient Storage for an upload the data dir had no room for, with the space it needs and the fix."""
    free = shutil.disk_usage(data_dir).free
    size = f"{needed} bytes ({needed / 2**20:.1f} MiB)" if needed is not None else f"more than {written} bytes"
    return ArtifactError(
        f"the agent's data directory {data_dir} is full: this upload needs {size}, {free} bytes "
        f"({free / 2**20:.1f} MiB) are free; nothing of it was kept",
        fix=f"free space on that disk (old artifacts in {data_dir / 'artifacts'}, engines in {data_dir / 'engines'}, "
            f"job folders in {data_dir / 'jobs'}), or restart the agent with --data-dir on a disk with room",
        status=507)


def programs_banner(trust_programs: bool) -> str:
    """The agent's line on what it accepts: data only, or torch.export programs too (said plainly: that is code)."""
    if trust_programs:
        return ("programs: TRUSTED (--trust-programs): torch.export programs (.pt2) are accepted, and any holder of "
                "this agent's token can run code on this device")
    return ("programs: refused (default): this agent takes data only (ONNX, device checkpoints, tensors, sidecars); "
            "start with --trust-programs to accept .pt2 programs")


def serve(config: AgentConfig) -> None:
    """Runs the agent with uvicorn until SIGINT/SIGTERM."""
    uvicorn = require("uvicorn", "uvicorn", "pip install 'edgefold[device]'")
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # The first line says which TensorRT this agent found, or why none: a Jetson agent that would time
    # ONNX Runtime under the board's name says so before it serves anything.
    print(runtime_banner(describe_device()), file=sys.stderr, flush=True)
    print(programs_banner(config.trust_programs), file=sys.stderr, flush=True)
    jtop_line = jtop_banner(jtop_status(config.jtop_socket))
    if jtop_line:
        print(jtop_line, file=sys.stderr, flush=True)
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                           access_log=False))
    app.state.server = server  # its should_exit ends held long polls at shutdown
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:  # what uvicorn.run does: a port in use, a failed startup
        sys.exit(STARTUP_FAILURE)

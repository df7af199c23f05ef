"""Soak of the device agent: a few thousand valid, malformed and hostile requests, cancels at random
moments and ``kill -9`` + restart cycles, against one real agent on loopback. Bounded in count and time.

    python bench/agent_soak.py                       # 2500 requests, 4 kill -9 cycles, ≤ 8 min of requests
    python bench/agent_soak.py --requests 300 --restarts 1 --max-seconds 60

Requests are drawn by hypothesis strategies: valid short jobs on a tiny ONNX model, job specs with
one or more fields replaced by NaN, ±Infinity, huge or negative numbers, numeric strings, lone
surrogates, lists, objects or null, unknown keys, broken preprocessing, bodies that are not objects,
raw bytes that are not JSON or not UTF-8, deep nesting, oversized bodies; reads of every route;
cancels of queued and running jobs, some fired at random delays after their submission.

Records (printed, and written to bench/results/agent-soak-<date>.json): requests sent; responses by
status; 5xx (goal 0); jobs accepted and, after the queue drains, jobs lost (404) or stuck queued or
running (goal 0); cancelled jobs whose child was still alive 1 s after the DELETE returned (goal 0);
job children left behind by a restart or at the end (goal 0); health answers that were not ``ok``;
the agent's RSS and open file descriptors at the start and end of each of its lifetimes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FIELDS = ("artifact", "runtime", "precision", "batch_sizes", "warmup_iterations", "iterations", "duration_s", "idle_s",
          "threads", "dla_core", "telemetry", "sample_hz", "timeout_s", "cuda_graphs", "channels_last", "label",
          "preprocess")
TINY_PREPROCESS = {"input_size": 16, "resize": 16, "channels": 3, "mean": [0.5, 0.5, 0.5], "std": [0.25] * 3}
MAX_QUEUE = 4  # valid submissions pause while this many of ours wait, so the final drain stays short
WARM_REQUESTS = 100  # a lifetime's "start" figures are taken after every route ran and this many requests
SAMPLE_EVERY = 250  # and its RSS and fds again every this many requests, to show a trend, not two samples


# ---------------------------------------------------------------- strategies
def hostile_scalars() -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0, 2**63, 2**64, -1, 0, 10**400]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**80), max_value=2**80),
        st.from_regex(r"-?[0-9]{1,6}(\.[0-9]{1,3})?", fullmatch=True),  # numbers as strings
        st.text(st.characters(categories=("Cs", "Lu", "Nd", "Zs", "So")), max_size=12),  # lone surrogates included
        st.booleans(), st.none())


def hostile_values() -> st.SearchStrategy:
    scalars = hostile_scalars()
    return st.one_of(scalars, st.lists(scalars, max_size=4),
                     st.dictionaries(st.text(max_size=6), scalars, max_size=3))


def valid_specs(sha: str) -> st.SearchStrategy:
    return st.fixed_dictionaries({"artifact": st.just(sha)}, optional={
        "iterations": st.integers(2, 20), "warmup_iterations": st.integers(0, 2), "idle_s": st.just(0),
        "batch_sizes": st.sampled_from([[1], [1, 2], [2]]), "telemetry": st.sampled_from([["host"], []]),
        "sample_hz": st.floats(5, 200), "timeout_s": st.just(60.0), "threads": st.integers(0, 2),
        "label": st.text(max_size=40), "preprocess": st.sampled_from([TINY_PREPROCESS, None]),
        "channels_last": st.booleans()}).map(lambda spec: {"idle_s": 0, "telemetry": ["host"], **spec})


def hostile_specs(sha: str) -> st.SearchStrategy:
    base = valid_specs(sha)
    broken_fields = st.dictionaries(st.sampled_from(FIELDS), hostile_values(), min_size=1, max_size=3)
    broken_preprocess = st.dictionaries(st.sampled_from(sorted(TINY_PREPROCESS) + ["interpolation", "extra"]),
                                        hostile_values(), min_size=1, max_size=2).map(
        lambda bad: {"preprocess": {**TINY_PREPROCESS, **bad}})
    missing_preprocess = st.sets(st.sampled_from(sorted(TINY_PREPROCESS)), min_size=1).map(
        lambda gone: {"preprocess": {k: v for k, v in TINY_PREPROCESS.items() if k not in gone}})
    unknown = st.dictionaries(st.text(max_size=10).filter(lambda key: key not in FIELDS), hostile_values(),
                              min_size=1, max_size=2)
    return st.tuples(base, st.one_of(broken_fields, broken_preprocess, missing_preprocess, unknown)).map(
        lambda pair: {**pair[0], **pair[1]})


def raw_bodies() -> st.SearchStrategy:
    return st.one_of(
        st.binary(max_size=64),
        st.sampled_from([b"", b"{", b"NaN", b"Infinity", b"-Infinity", b"1e999", b"null", b'"\\ud800"',
                         b'{"artifact": NaN}', b'{"artifact": "\\udfff"}', b"\xff\xfe{}", b'{"a": 1, "a": 2}',
                         b"[" * 20000 + b"]" * 20000, b'{"label": "' + b"x" * 70000 + b'"}']),
        hostile_values().map(lambda value: json.dumps(value).encode()))


def actions(sha: str) -> st.SearchStrategy:
    kinds = ["valid"] * 5 + ["hostile"] * 20 + ["raw"] * 5 + ["cancel"] * 4 + ["read"] * 6
    by_kind = {"valid": valid_specs(sha), "hostile": hostile_specs(sha), "raw": raw_bodies(),
               "cancel": st.tuples(st.booleans(), st.floats(0, 1)),
               "read": st.sampled_from(["jobs", "job", "health", "metrics", "device", "artifact", "queued",
                                        "missing-job", "odd-job-id", "openapi"])}
    return st.sampled_from(kinds).flatmap(lambda kind: by_kind[kind].map(lambda payload: (kind, payload)))


# ---------------------------------------------------------------- processes
def job_children(jobs_dir: Path) -> dict[int, str]:
    """Live (non-zombie) job processes of this agent: pid → job id, from their command lines."""
    found = {}
    marker = os.fsencode(str(jobs_dir)) + b"/"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"device.jobs.jobrun" in cmdline and state not in ("Z", "X"):
            for arg in cmdline:
                if arg.startswith(marker):
                    found[int(entry)] = os.fsdecode(arg[len(marker):]).strip("/")
    return found


def rss_and_fds(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return {"rss_mib": round(rss_kb / 1024, 1), "open_fds": len(os.listdir(f"/proc/{pid}/fd"))}


class CancelWatch(threading.Thread):
    """Checks, 1 s after each cancel returned, that the cancelled job's child is gone."""

    def __init__(self, jobs_dir: Path):
        super().__init__(daemon=True)
        self.jobs_dir, self.due, self.lock = jobs_dir, [], threading.Condition()
        self.checked, self.outlived, self.stopping = 0, [], False

    def add(self, job_id: str) -> None:
        with self.lock:
            heapq.heappush(self.due, (time.monotonic() + 1.0, job_id))
            self.lock.notify()

    def run(self) -> None:
        while True:
            with self.lock:
                while not self.due and not self.stopping:
                    self.lock.wait()
                if not self.due:
                    return
                at, job_id = self.due[0]
                if time.monotonic() < at:
                    self.lock.wait(at - time.monotonic())
                    continue
                heapq.heappop(self.due)
            if job_id in job_children(self.jobs_dir).values():
                self.outlived.append(job_id)
            self.checked += 1

    def finish(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify()
        self.join(10)


# ---------------------------------------------------------------- the soak
class Soak:
    def __init__(self, agent, sha: str, rng: random.Random):
        import httpx

        self.agent, self.sha, self.rng, self.httpx = agent, sha, rng, httpx
        self.http = httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=60)
        self.sent, self.statuses, self.server_errors = 0, Counter(), []
        self.transport_errors: list[str] = []
        self.accepted: dict[str, str] = {}  # job id → "valid" | "hostile" (a mutation that happened to be valid)
        self.active: set[str] = set()  # accepted, not yet seen finished
        self.valid_refused: list[str] = []
        self.cancels = Counter()
        self.delayed: list[tuple[float, str]] = []
        self.health_not_ok = 0
        self.watch = CancelWatch(agent.data_dir / "jobs")
        self.watch.start()
        self.lifetimes: list[dict[str, Any]] = []
        self.lifetime_requests = 0

    # -- plumbing
    def request(self, method: str, path: str, **kwargs):
        self.sent += 1
        self.lifetime_requests += 1
        if self.lifetime_requests == WARM_REQUESTS:
            self.lifetimes[-1]["start"] = rss_and_fds(self.agent.process.pid)
        elif self.lifetime_requests % SAMPLE_EVERY == 0:
            self.lifetimes[-1]["samples"].append({"requests": self.lifetime_requests,
                                                  **rss_and_fds(self.agent.process.pid)})
        try:
            response = self.http.request(method, path, **kwargs)
        except self.httpx.TransportError as err:
            self.transport_errors.append(f"{method} {path}: {type(err).__name__}")
            return None
        self.statuses[response.status_code] += 1
        if response.status_code >= 500:
            self.server_errors.append({"request": f"{method} {path}", "status": response.status_code,
                                       "body": repr(kwargs.get("content", b""))[:300], "answer": response.text[:300]})
        return response

    def post_job(self, body: bytes):
        return self.request("POST", "/v1/jobs", content=body, headers={"Content-Type": "application/json"})

    def cancel(self, job_id: str) -> None:
        response = self.request("DELETE", f"/v1/jobs/{job_id}")
        if response is None:
            return
        self.cancels[response.status_code] += 1
        if response.status_code == 200:
            self.watch.add(job_id)
        if response.status_code in (200, 409):
            self.active.discard(job_id)

    # -- one action
    def do(self, kind: str, payload: Any) -> None:
        now = time.monotonic()
        while self.delayed and self.delayed[0][0] <= now:
            self.cancel(heapq.heappop(self.delayed)[1])
        if kind == "valid":
            if len(self.active) >= MAX_QUEUE:
                self.refresh_active()
            if len(self.active) >= MAX_QUEUE:
                return
            else:
                response = self.post_job(json.dumps(payload).encode())
                if response is not None and response.status_code == 201:
                    job_id = response.json()["id"]
                    self.accepted[job_id], self.active = "valid", self.active | {job_id}
                    if self.rng.random() < 0.35:  # a cancel at a random moment of its life
                        heapq.heappush(self.delayed, (now + self.rng.uniform(0, 3), job_id))
                elif response is not None:
                    self.valid_refused.append(f"{response.status_code}: {response.text[:200]}")
                return
        if kind == "hostile":
            response = self.post_job(json.dumps(payload).encode())
            if response is not None and response.status_code == 201:
                job_id = response.json()["id"]
                self.accepted[job_id] = "hostile"
                self.active.add(job_id)
                self.cancel(job_id)  # valid by chance: it may ask for an hour-long window
        elif kind == "raw":
            self.post_job(payload)
        elif kind == "cancel":
            running_first, pick = payload
            target = None
            if running_first:
                response = self.request("GET", "/v1/jobs", params={"state": "running", "limit": 1})
                if response is not None and response.status_code == 200 and response.json():
                    target = response.json()[0]["id"]
            if target is None and self.active:
                ids = sorted(self.active)
                target = ids[min(int(pick * len(ids)), len(ids) - 1)]
            if target is not None:
                self.cancel(target)
        elif kind == "read":
            self.read(payload)

    def refresh_active(self) -> None:
        """Forgets the jobs the agent no longer has queued or running."""
        alive = set()
        for state in ("queued", "running"):
            response = self.request("GET", "/v1/jobs", params={"state": state, "limit": 1000})
            if response is None or response.status_code != 200:
                return
            alive |= {job["id"] for job in response.json()}
        self.active &= alive

    def read(self, what: str) -> None:
        if what == "jobs":
            self.request("GET", "/v1/jobs", params={"limit": self.rng.choice([1, 10, 1000])})
        elif what == "queued":
            self.request("GET", "/v1/jobs", params={"state": "queued"})
        elif what == "job" and self.accepted:
            job_id = self.rng.choice(sorted(self.accepted))
            response = self.request("GET", f"/v1/jobs/{job_id}")
            if response is not None and response.status_code == 200 and response.json()["state"] not in (
                    "queued", "running"):
                self.active.discard(job_id)
        elif what == "health":
            response = self.request("GET", "/v1/health")
            if response is None or response.status_code != 200 or response.json()["status"] != "ok":
                self.health_not_ok += 1
        elif what == "metrics":
            self.request("GET", "/metrics")
        elif what == "device":
            self.request("GET", "/v1/device")
        elif what == "artifact":
            self.request("GET", f"/v1/artifacts/{self.sha}")
        elif what == "missing-job":
            self.request("GET", "/v1/jobs/000000000000")
        elif what == "odd-job-id":
            self.request(self.rng.choice(["GET", "DELETE"]), "/v1/jobs/%ED%A0%80%00..%2F" + "x" * 300)
        elif what == "openapi":
            self.request("GET", "/openapi.json")

    # -- lifetimes
    def begin_lifetime(self) -> None:
        self.lifetimes.append({"requests_before": self.sent, "samples": []})
        self.lifetime_requests = 0
        # Every route once (lazy imports such as the device description load here), so "start" is warm.
        for what in ("device", "metrics", "jobs", "health", "openapi", "artifact", "missing-job", "odd-job-id"):
            self.read(what)
        self.post_job(b'{"artifact": NaN}')

    def end_lifetime(self) -> None:
        life = self.lifetimes[-1]
        life["end"] = rss_and_fds(self.agent.process.pid)
        life["requests"] = self.sent - life["requests_before"]

    def restart(self) -> dict[str, Any]:
        """kill -9 the agent and start it again; reports children left behind once it is back."""
        # Kill it mid-measurement: a job of a few seconds, once its child is up.
        response = self.post_job(json.dumps({"artifact": self.sha, "duration_s": 5.0, "idle_s": 0,
                                             "telemetry": ["host"], "label": "killed mid-job"}).encode())
        if response is not None and response.status_code == 201:
            job_id = response.json()["id"]
            self.accepted[job_id] = "valid"
            self.active.add(job_id)
            deadline = time.monotonic() + 60
            while job_id not in job_children(self.agent.data_dir / "jobs").values() and time.monotonic() < deadline:
                time.sleep(0.1)
        self.end_lifetime()
        before = job_children(self.agent.data_dir / "jobs")
        self.agent.stop(signal.SIGKILL)
        self.agent.start()
        self.begin_lifetime()
        time.sleep(1.0)  # recovery ran before the agent answered; give a SIGKILLed orphan time to be reaped
        after = job_children(self.agent.data_dir / "jobs")
        # A child still alive now must be the one job the new agent is running.
        running = self.request("GET", "/v1/jobs", params={"state": "running"})
        running_ids = {job["id"] for job in running.json()} if running is not None and running.status_code == 200 \
            else set()
        left = {pid: job for pid, job in after.items() if job not in running_ids}
        return {"children_before_kill": len(before), "orphans_after_restart": len(left)}

    def drain(self, budget_s: float) -> float:
        started = time.monotonic()
        for _, job_id in sorted(self.delayed):
            self.cancel(job_id)
        self.delayed.clear()
        while time.monotonic() - started < budget_s:
            busy = 0
            for state in ("queued", "running"):
                response = self.request("GET", "/v1/jobs", params={"state": state, "limit": 1000})
                busy += len(response.json()) if response is not None and response.status_code == 200 else 1
            if not busy:
                break
            time.sleep(0.5)
        return time.monotonic() - started

    def verify(self) -> dict[str, Any]:
        states, lost, stuck = Counter(), [], []
        for job_id in self.accepted:
            response = self.request("GET", f"/v1/jobs/{job_id}")
            if response is None or response.status_code == 404:
                lost.append(job_id)
                continue
            state = response.json()["state"]
            states[state] += 1
            if state in ("queued", "running"):
                stuck.append(job_id)
        return {"states": dict(states), "lost": lost, "stuck": stuck}


def main() -> int:
    from device.service.loopback import LoopbackAgent
    from tests.device.agent_process import tiny_onnx

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2500, help="requests to send (the verification adds some)")
    parser.add_argument("--restarts", type=int, default=4, help="kill -9 + restart cycles, spread over the run")
    parser.add_argument("--max-seconds", type=float, default=480, help="stop sending after this long")
    parser.add_argument("--drain-seconds", type=float, default=120, help="at most this long for the queue to empty")
    parser.add_argument("--pace-ms", type=float, default=60, help="pause between requests, so jobs get to run")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    # Restarts in the first 60% of the run, so the last lifetime is the longest one (its RSS/fd figures).
    restart_at = sorted({int(args.requests * 0.6 * (i + 1) / (args.restarts + 1)) for i in range(args.restarts)})
    restarts: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_onnx(Path(tmp) / "tiny.onnx")
        agent = LoopbackAgent(Path(tmp) / "agent", args=("--job-timeout-s", "60")).start()
        try:
            with agent.client() as client:
                sha = client.upload(model)
            soak = Soak(agent, sha, rng)
            soak.begin_lifetime()

            def batch(n: int) -> None:
                @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                          suppress_health_check=list(HealthCheck))
                @given(action=actions(sha))
                def step(action):
                    soak.do(*action)
                    time.sleep(args.pace_ms / 1000)

                step()

            while soak.sent < args.requests and time.monotonic() - started < args.max_seconds:
                if restart_at and soak.sent >= restart_at[0]:
                    restart_at.pop(0)
                    restarts.append(soak.restart())
                    print(f"[soak] {soak.sent} requests; kill -9 and restart: {restarts[-1]}", file=sys.stderr)
                batch(min(50, args.requests - soak.sent))
                if soak.sent // 500 != (soak.sent - 50) // 500:
                    print(f"[soak] {soak.sent} requests, {len(soak.server_errors)} 5xx, "
                          f"{len(soak.accepted)} jobs, {time.monotonic() - started:.0f} s", file=sys.stderr)
            sending_s = time.monotonic() - started
            drain_s = soak.drain(args.drain_seconds)
            verdict = soak.verify()
            time.sleep(1.0)
            soak.watch.finish()
            soak.end_lifetime()
            left_at_end = job_children(agent.data_dir / "jobs")
        finally:
            agent.stop()
        log_tail = agent.log.read_text(errors="replace").splitlines()[-5:] if agent.log.exists() else []
    final = soak.lifetimes[-1]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "seed": args.seed, "host_cpus": os.cpu_count(),
        "requests_sent": soak.sent, "sending_s": round(sending_s, 1), "drain_s": round(drain_s, 1),
        "statuses": {str(k): v for k, v in sorted(soak.statuses.items())},
        "server_errors_5xx": len(soak.server_errors), "server_error_examples": soak.server_errors[:10],
        "transport_errors": len(soak.transport_errors), "transport_error_examples": soak.transport_errors[:5],
        "jobs_accepted": len(soak.accepted),
        "jobs_accepted_from_hostile_draws": sum(kind == "hostile" for kind in soak.accepted.values()),
        "valid_jobs_refused": len(soak.valid_refused), "valid_refused_examples": soak.valid_refused[:5],
        "final_states": verdict["states"], "jobs_lost": len(verdict["lost"]), "jobs_stuck": len(verdict["stuck"]),
        "cancels_by_status": {str(k): v for k, v in sorted(soak.cancels.items())},
        "cancels_checked_after_1s": soak.watch.checked, "cancelled_children_alive_after_1s": len(soak.watch.outlived),
        "kill9_restarts": restarts, "orphans_after_restarts": sum(r["orphans_after_restart"] for r in restarts),
        "children_left_at_end": len(left_at_end), "health_not_ok": soak.health_not_ok,
        "lifetimes": soak.lifetimes, "final_lifetime": final, "agent_log_tail": log_tail,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"agent-soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: result[k] for k in ("requests_sent", "sending_s", "server_errors_5xx", "transport_errors",
                                      "jobs_accepted", "final_states", "jobs_lost", "jobs_stuck",
                                      "cancelled_children_alive_after_1s", "cancels_checked_after_1s",
                                      "orphans_after_restarts", "children_left_at_end", "health_not_ok",
                                      "statuses", "final_lifetime")}
    print(json.dumps(summary, indent=1))
    print(f"written: {path}", file=sys.stderr)
    bad = (result["server_errors_5xx"] or result["jobs_lost"] or result["jobs_stuck"]
           or result["cancelled_children_alive_after_1s"] or result["orphans_after_restarts"]
           or result["children_left_at_end"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

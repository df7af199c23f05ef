"""The agent's SQLite store: order, atomic state changes, survival across reopen."""

from device.schema import JobSpec
from device.service.store import Store

SHA = "a" * 64


def test_jobs_run_in_submission_order_and_finish_once(tmp_path):
    store = Store(tmp_path)
    first, second = store.submit(JobSpec(artifact=SHA)), store.submit(JobSpec(artifact=SHA, label="2"))
    assert store.claim_next().id == first.id
    assert store.claim_next().id == second.id and store.claim_next() is None
    assert store.finish(first.id, "succeeded", result={"x": 1})
    assert not store.finish(first.id, "cancelled"), "a finished job is never overwritten"
    assert store.get(first.id).result == {"x": 1} and store.get(first.id).state == "succeeded"
    assert store.counts() == {"succeeded": 1, "running": 1}


def test_state_survives_reopening_and_wal_is_on(tmp_path):
    store = Store(tmp_path)
    job = store.submit(JobSpec(artifact=SHA))
    reopened = Store(tmp_path)
    assert reopened.get(job.id).spec == job.spec and reopened.get(job.id).state == "queued"
    import sqlite3

    assert sqlite3.connect(tmp_path / "agent.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"

"""Shared fixtures. Tests run on two noisy cores: OpenMP must not spin (OMP_WAIT_POLICY)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("EDGEFOLD_PROGRESS", "0")
os.environ.setdefault("EDGEFOLD_DEVICE", "cpu")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.slow import SLOW_FIXTURES, slow_fixture  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


# `make test` runs each file whole on one worker (--dist loadfile) in collection order (--no-loadscope-reorder): the
# longest files first, so that the workers end together (longest processing time first). The lengths are the newest
# record of `bench/suite_time.py` (bench/results/suite-time-test-*.json, per file as measured); a file the record does
# not know (a new one) counts as the record's median file. Rerun the bench after a change to the suite's time.
SUITE_RECORDS = REPO / "bench" / "results"


def recorded_file_seconds(folder: Path = SUITE_RECORDS) -> dict[str, float]:
    """Seconds per test file in the newest ``make test`` record (empty without one: collection order alone)."""
    import json

    records = sorted(folder.glob("suite-time-test-2*.json"))  # dated names sort by time; -fast- records excluded
    return dict(json.loads(records[-1].read_text()).get("files", {})) if records else {}


def longest_first(paths: list[str], seconds: dict[str, float]) -> list[str]:
    """``paths`` ordered by recorded seconds, longest first (an unknown file as the median one; ties by name)."""
    known = sorted(seconds.values())
    unknown = known[len(known) // 2] if known else 0.0
    return sorted(dict.fromkeys(paths), key=lambda path: (-seconds.get(path, unknown), path))


def pytest_collection_modifyitems(items):
    """Every test that uses a slow fixture (a pipeline run, a real agent), directly or through another, is slow;
    the files are ordered longest first (:func:`longest_first`; a stable sort: tests within a file keep theirs)."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    files = [item.nodeid.split("::", 1)[0] for item in items]
    rank = {path: index for index, path in enumerate(longest_first(files, recorded_file_seconds()))}
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
@slow_fixture
def tiny_run(tmp_path_factory):
    """One full run of the ``tiny`` recipe, shared by the tests that read its results.

    Under pytest-xdist every worker would run it again (session fixtures are per worker): the first worker to get
    here runs it into the session's shared base folder, the others wait on a lock, copy that runs folder and
    re-run the recipe there, which finds every stage cached (a few seconds). Each worker keeps its own copy, so a
    test that edits its run cannot disturb another worker's.
    """
    from pipeline.runner import run_pipeline

    recipe = str(REPO / "models" / "tiny.yaml")
    runs = tmp_path_factory.mktemp("runs")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import shutil

        from filelock import FileLock  # torch's own dependency

        shared = tmp_path_factory.getbasetemp().parent / "tiny-run-shared"
        with FileLock(f"{shared}.lock"):
            if not (shared / "complete").exists():
                shutil.rmtree(shared, ignore_errors=True)
                run_pipeline(recipe, runs_dir=shared / "runs", run_id="shared")
                (shared / "complete").touch()
        shutil.rmtree(runs)
        shutil.copytree(shared / "runs", runs, symlinks=True)
    return run_pipeline(recipe, runs_dir=runs, run_id="shared")

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


# The longest test files (measured with --durations on two xdist workers), longest first. `make test` runs each
# file whole on one worker (--dist loadfile) in collection order (--no-loadscope-reorder), so these start first and
# the two workers end together. The first two start at once, on different workers: the first builds the shared tiny
# run while the second needs none. A file missing here only runs later; nothing else depends on the list.
LONGEST_FIRST = (
    # Three timm runs on one thread, first: over when the timing-sensitive files (planted power, sustained) start.
    "tests/pipeline/test_byom_folded.py",
    "tests/pipeline/test_integrity.py",
    "tests/pipeline/test_detection_start.py",
    "tests/pipeline/test_latency_prune.py",
    "tests/bench/test_latency_prune.py",
    "tests/docker/test_docker.py",
    "tests/pipeline/test_detection_stages.py",
    "tests/device/test_sweep.py",
    "tests/pipeline/test_distributed.py",
    "tests/pipeline/test_detection_resume.py",
    "tests/device/test_torch_tensorrt.py",
    "tests/pipeline/test_quantize.py",
    "tests/pipeline/test_report.py",
    "tests/device/test_agent.py",
    "tests/pipeline/test_detection_pruning.py",
    "tests/pipeline/test_report_power.py",
    "tests/bench/test_dc_baseline.py",
    "tests/device/test_planted_power.py",
    "tests/device/test_agent_jtop.py",
)


def pytest_collection_modifyitems(items):
    """Every test that uses a slow fixture (a pipeline run, a real agent), directly or through another, is slow;
    the files in :data:`LONGEST_FIRST` are moved to the front, in that order (a stable sort: tests within a file keep
    theirs)."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


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

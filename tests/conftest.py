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


def pytest_collection_modifyitems(items):
    """Every test that uses a slow fixture (a pipeline run, a real agent), directly or through another, is slow."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
@slow_fixture
def tiny_run(tmp_path_factory):
    """One full run of the ``tiny`` recipe, shared by the tests that read its results."""
    from pipeline.runner import run_pipeline

    runs = tmp_path_factory.mktemp("runs")
    ctx = run_pipeline(str(REPO / "models" / "tiny.yaml"), runs_dir=runs, run_id="shared")
    return ctx

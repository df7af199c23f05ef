"""Shared fixtures. Tests run on two noisy cores: OpenMP must not spin (OMP_WAIT_POLICY)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("EDGEFOLD_PROGRESS", "0")
os.environ.setdefault("EDGEFOLD_DEVICE", "cpu")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """One full run of the ``tiny`` recipe, shared by the tests that read its results."""
    from pipeline.runner import run_pipeline

    runs = tmp_path_factory.mktemp("runs")
    ctx = run_pipeline(str(REPO / "models" / "tiny.yaml"), runs_dir=runs, run_id="shared")
    return ctx

"""Which fixtures make a test slow: one that runs a pipeline or starts a real agent marks every test using it.

A fixture declares it with ``@slow_fixture`` under its ``@pytest.fixture``; ``conftest.py`` then gives every test
whose fixture closure holds it the ``slow`` marker, so ``-m "not slow"`` leaves it out whatever module it is in.
"""

from __future__ import annotations

SLOW_FIXTURES: set[str] = set()


def slow_fixture(function):
    """Registers ``function``, a fixture, as slow (by its name, the name tests ask for it by)."""
    SLOW_FIXTURES.add(function.__name__)
    return function

"""The pipeline's one log: messages to stderr from rank 0 only (under torchrun every rank runs the
training stages, and N copies of each line helped nobody)."""

from __future__ import annotations

import sys


def log(message: str) -> None:
    """Writes one line (or several) of the run's log; silent on ranks other than 0."""
    from pipeline import distributed

    if distributed.world().main:
        print(message, file=sys.stderr, flush=True)

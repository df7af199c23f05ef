"""The pipeline's one log: messages to stderr from rank 0 only (under torchrun every rank runs the
training stages, and N copies of each line helped nobody); and progress as log lines, through tqdm."""

from __future__ import annotations

import sys
from typing import Callable

from tqdm import tqdm

# tqdm's own fields: count, share, rate and remaining time (mm:ss); set_postfix values follow.
LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt}{unit} ({percentage:.0f}%), {rate_fmt}, ETA {remaining}{postfix}"


def log(message: str) -> None:
    """Writes one line (or several) of the run's log; silent on ranks other than 0."""
    from pipeline.core import distributed

    if distributed.world().main:
        print(message, file=sys.stderr, flush=True)


class _LogLines(tqdm):
    """tqdm whose every refresh is one log line (``display`` is tqdm's documented hook for other front ends)."""

    def __init__(self, *args, log_fn: Callable[[str], None], **kwargs) -> None:
        self.log_fn = log_fn
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg is None:  # tqdm passes msg="" only to clear a bar that is closing: no line for that
            self.log_fn(self.__str__())
        return True


def progress_lines(total: int, desc: str, unit: str, log_fn: Callable[[str], None] = log, every_s: float = 15.0,
                   every: float = 1, disable: bool = False) -> tqdm:
    """Progress with rate and ETA as log lines, for runs without a terminal and for minutes-long loops.

    Args:
        total: Steps expected.
        desc: What is progressing (the line's start).
        unit: What one step is, plural ("jobs", "batches").
        log_fn: Where each line goes.
        every_s: At most one line this often, and none before this long has passed (short loops stay quiet).
        every: At most one line per this many steps too.
        disable: No lines at all (the ranks other than 0).

    Returns:
        A tqdm to ``update()`` (and ``set_postfix()``) as usual, then ``close()``.
    """
    return _LogLines(total=total, desc=desc, unit=f" {unit}", log_fn=log_fn, bar_format=LINE_FORMAT,
                     mininterval=every_s, delay=every_s, miniters=max(1, int(every)),
                     # No monitor thread's refresh: it would log off-schedule, from another thread.
                     maxinterval=float("inf"), leave=False, position=0, file=sys.stderr, disable=disable)

"""One training step tried in a forked child before a run commits to a memory format.

PyTorch 2.14.1 corrupts its heap training some models in channels_last on a CPU (timm's ``fastvit_t8`` with the
AVX2 kernels: SIGSEGV, or SIGABRT "free(): invalid next size"; the same model trains contiguous). The training
engine chooses channels_last by itself from 64 px, so before it does, one forward and backward run in a child
process: a child killed by a signal says that format crashes here, and the parent has not been touched.

The child is forked (the model and the batch are already in memory) and runs on one thread: a child forked after
the parent used OpenMP's thread pool hangs in its first parallel region (seen here with PyTorch's GNU OpenMP); with
one thread no pool is entered.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Callable

TIMEOUT_S = 300.0
"""Longest wait for the child's step (one thread, one batch: ResNet-50 at 224 px, batch 64, about 40 s here)."""


def crashes(step: Callable[[], Any], timeout_s: float = TIMEOUT_S) -> int | None:
    """Runs ``step`` (one forward and backward, whose effects are thrown away with the child) in a forked child on
    one thread. Returns the signal that killed the child, or None when it finished (or raised: a Python error is the
    parent's to meet and report) or timed out (a slow child is not a crash)."""
    if not hasattr(os, "fork"):
        return None
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_run, args=(step,), daemon=True)
    child.start()
    child.join(timeout_s)
    if child.exitcode is None:
        child.kill()
        child.join()
        return None
    return -child.exitcode if child.exitcode < 0 else None


def _run(step: Callable[[], Any]) -> None:
    import torch

    torch.set_num_threads(1)
    try:
        step()
    except BaseException:  # noqa: BLE001 (the parent meets a Python error itself, with its traceback)
        os._exit(0)
    os._exit(0)

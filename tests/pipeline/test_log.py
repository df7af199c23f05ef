"""Progress as log lines (tqdm's counting, rate and ETA) for runs without a terminal."""

import re

from pipeline.core.log import progress_lines


def test_long_loops_say_how_far_they_are_with_rate_and_eta():
    lines = []
    progress = progress_lines(4, "[   prune] latency: measuring", "jobs", lines.append, every_s=0.0)
    for _ in range(4):
        progress.set_postfix({"loss": "0.123"}, refresh=False)
        progress.update()
    progress.close()
    assert lines[1].startswith("[   prune] latency: measuring: 1/4 jobs (25%), ")
    assert re.search(r"jobs/s, ETA \d\d:\d\d, loss=0.123$", lines[1]), lines[1]
    assert lines[-1].startswith("[   prune] latency: measuring: 4/4 jobs (100%)")


def test_progress_lines_wait_for_their_interval_and_step_share():
    hourly, per_half = [], []
    progress = progress_lines(10, "table", "jobs", hourly.append, every_s=3600.0)
    tenths = progress_lines(10, "epoch 1/3", "batches", per_half.append, every_s=0.0, every=5)
    for _ in range(10):
        progress.update()
        tenths.update()
    progress.close()
    tenths.close()
    assert hourly == []  # nothing before an hour has passed, and nothing on closing
    assert [line.split(": ")[1].split(" ")[0] for line in per_half] == ["0/10", "5/10", "10/10"]


def test_other_ranks_log_nothing():
    lines = []
    progress = progress_lines(3, "epoch", "batches", lines.append, every_s=0.0, disable=True)
    for _ in range(3):
        progress.update()
    progress.close()
    assert lines == []

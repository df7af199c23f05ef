"""The planted clock the sustained tests share with their job processes (:mod:`tests.device.time_scale`)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.device.time_scale import ENV_ORIGIN, ENV_SCALE, TimeScale, install_in_job_process

PROBE = """
import time
from pathlib import Path
import pytest

from tests.conftest import REPO
from tests.device.time_scale import install_in_job_process
Path('cmdline').write_bytes(b'python\\0-m\\0device.jobs.jobrun\\0job')
host = time.monotonic
scale = install_in_job_process(Path('cmdline'))
began, host_began = time.monotonic(), host()
time.sleep(0.8)
print(scale.scale, time.monotonic() - began, host() - host_began, time.time() > host() + 100,
      time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic() > 80000)
"""


def test_the_clock_runs_scale_times_the_hosts_from_one_origin_in_every_process(tmp_path):
    clock = TimeScale.starting_now(4.0)
    assert TimeScale.from_environment(clock.environment()) == clock
    assert TimeScale.from_environment({}) is None
    # Its origin a minute back: from the start it reads three minutes ahead of the host's clock.
    assert 179 < clock.wall() - time.time() < 182
    assert clock.host_seconds(120) == 30
    env = {**clock.environment(), "PYTHONPATH": str(REPO)}
    said = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=True).stdout.split()
    assert said[0] == "4.0" and said[3:] == ["True", "True"], said
    simulated, host = float(said[1]), float(said[2])
    assert host >= 0.2 and simulated == pytest.approx(4 * host, rel=0.01), "a simulated 0.8 s is 0.2 s of the host's"


def test_only_a_job_process_takes_the_clock(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_SCALE, "4.0")
    monkeypatch.setenv(ENV_ORIGIN, "0.0,0.0")
    agent = tmp_path / "cmdline"
    agent.write_bytes(b"python\0-m\0device.cli\0serve")
    assert install_in_job_process(agent) is None, "the agent itself keeps the host's clock"
    assert install_in_job_process(tmp_path / "missing") is None
    monkeypatch.delenv(ENV_SCALE)
    agent.write_bytes(b"python\0-m\0device.service.zygote")
    assert install_in_job_process(agent) is None, "no clock without the variables"

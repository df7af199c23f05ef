"""The sampler base and its energy arithmetic; the host sampler against this real process."""

import math
import time

import numpy as np
import pytest

from device.errors import ConfigError
from device.telemetry import Sampler, Trace
from device.telemetry.base import energy_per_inference
from device.telemetry.host import HostSampler


def test_integral_and_time_weighted_mean_match_hand_values():
    # 2 W for 1 s then 4 W for 1 s, sampled at 0, 1, 2 s: trapezoids give 3000 + ... mJ.
    trace = Trace.from_samples([(0.0, {"power_mw": 2000}), (1.0, {"power_mw": 2000}), (2.0, {"power_mw": 4000})], 1.0)
    assert trace.integral("power_mw") == pytest.approx(2000 + 3000)
    assert trace.mean("power_mw") == pytest.approx(2500)
    assert trace.peak("power_mw") == 4000 and trace.achieved_hz == pytest.approx(1.0)


def test_uneven_sampling_is_weighted_by_time():
    """Samples bunched in a low-power second must not drag the mean down (a sample average would)."""
    samples = [(t, {"power_mw": 1000.0}) for t in np.linspace(0, 1, 11)] + [(3.0, {"power_mw": 1000.0})]
    samples[-1] = (3.0, {"power_mw": 5000.0})
    trace = Trace.from_samples(samples, 10.0)
    sample_mean = np.mean([v["power_mw"] for _, v in samples])
    assert trace.mean("power_mw") == pytest.approx((1000 * 1 + 3000 * 2) / 3)
    assert trace.mean("power_mw") > sample_mean


def test_energy_per_inference_total_and_above_idle():
    trace = Trace.from_samples([(0.0, {"power_mw": 6000}), (2.0, {"power_mw": 6000})], 1.0)
    result = energy_per_inference(trace, inferences=100, idle_mw=4000)
    assert result["energy_mj_per_inference"] == pytest.approx(120.0)
    assert result["energy_above_idle_mj_per_inference"] == pytest.approx(40.0)
    with pytest.raises(ConfigError, match="inferences must be positive"):
        energy_per_inference(trace, inferences=0)


def test_missing_values_are_skipped_not_zeroed():
    trace = Trace.from_samples([(0.0, {"power_mw": 1000}), (1.0, {}), (2.0, {"power_mw": 1000})], 1.0)
    assert math.isnan(trace.values["power_mw"][1])
    assert trace.integral("power_mw") == pytest.approx(2000)


class RampSampler(Sampler):
    """A stand-in source (no hardware here): power rises 1 W per second from 1 W."""

    name = "ramp"

    def __init__(self, rate_hz, fail_after=None):
        super().__init__(rate_hz)
        self.reads, self.fail_after, self.t0 = 0, fail_after, time.monotonic()

    def read(self):
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise EOFError("service gone")
        return {"power_mw": 1000.0 + 1000.0 * (time.monotonic() - self.t0)}


def test_thread_samples_the_window_and_fences_both_ends():
    sampler = RampSampler(rate_hz=50)
    with sampler:
        sampler.start()
        started = time.monotonic()
        time.sleep(0.3)
        trace = sampler.stop()
        ended = time.monotonic()
    assert len(trace.times_s) >= 3 and np.all(np.diff(trace.times_s) > 0)
    assert trace.times_s[0] <= started and trace.times_s[-1] <= ended
    # The ramp's exact integral over the sampled span (trapezoids are exact for a linear signal;
    # the tolerance covers the microseconds between a sample's stamp and its read).
    t = trace.times_s - sampler.t0
    assert trace.integral("power_mw") == pytest.approx(1000 * (t[-1] - t[0]) + 500 * (t[-1] ** 2 - t[0] ** 2), rel=1e-3)


def test_a_failing_source_is_recorded_not_raised():
    sampler = RampSampler(rate_hz=100, fail_after=2)
    sampler.start()
    time.sleep(0.3)
    trace = sampler.stop()
    assert len(trace.times_s) == 2 and len(trace.errors) == 1
    assert trace.errors[0].startswith("EOFError: service gone (×")


def test_rate_is_validated_and_double_start_refused():
    with pytest.raises(ConfigError, match="sampling rate"):
        RampSampler(rate_hz=0)
    sampler = RampSampler(rate_hz=10)
    sampler.start()
    with pytest.raises(RuntimeError, match="already running"):
        sampler.start()
    sampler.stop()


def test_host_sampler_reads_this_process(tmp_path):
    fake_rapl = tmp_path / "energy_uj"
    fake_rapl.write_text("123456\n")  # RAPL itself is root-only or absent on most hosts; a file stands in
    with HostSampler(rate_hz=20, rapl_path=fake_rapl) as sampler:
        sampler.start()
        ballast = np.ones(20_000_000, dtype=np.uint8)  # 19 MiB touched during the window
        ballast.sum()
        time.sleep(0.2)
        trace = sampler.stop()
    assert sampler.rapl_readable and trace.values["rapl_energy_uj"][0] == 123456
    assert trace.peak("rss_mb") > 19 and "cpu_percent" in trace.values
    with HostSampler(rapl_path=tmp_path / "absent") as sampler:
        assert "rapl_energy_uj" not in sampler.read()

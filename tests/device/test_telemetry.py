"""The sampler base and its energy arithmetic; the host sampler against this real process."""

import math
import time

import numpy as np
import pytest

from device.errors import ConfigError
from device.telemetry import Sampler, Trace
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


# ------------------------------------------------------------------ exact windows, coverage, flags
from device.telemetry.base import covered_intervals, window_energy  # noqa: E402


def stream(start, stop, step=0.01):
    """One-image calls back to back over [start, stop]."""
    return [(t, min(t + step, stop), 1) for t in np.arange(start, stop - 1e-9, step)]


def test_window_energy_interpolates_at_the_edges_and_ignores_samples_outside():
    """Samples at 0, 1, 2, 3 s bracket a window [0.5, 2.5]; the linear series 1→4 W integrates to 5000 mJ.

    The old protocol integrated every sample it had, so the sample after the window counted in full.
    """
    trace = Trace.from_samples([(float(t), {"p": 1000.0 * (t + 1)}) for t in range(4)], 1.0, gap_limit_s=1.5)
    result = window_energy(trace, 0.5, 2.5, stream(0.5, 2.5), power_key="p", idle_mw=1000.0)
    assert result["coverage"] == pytest.approx(1.0) and result["max_gap_s"] == pytest.approx(1.0)
    # ∫ 1000·(t+1) dt over [0.5, 2.5] = 1000·(2.5²−0.5²)/2 + 1000·2 = 5000 mJ over 200 images.
    assert result["energy_mj_per_image"] == pytest.approx(5000 / 200)
    assert result["energy_above_idle_mj_per_image"] == pytest.approx((5000 - 1000 * 2) / 200)
    assert result["window_power_mw"] == pytest.approx(2500)


def test_a_gap_is_not_covered_and_its_images_do_not_count():
    """A source lost for the middle second: energy and images both come from the covered 2 s only."""
    samples = [(t, {"p": 4000.0}) for t in np.arange(0.0, 1.001, 0.1)] + \
              [(t, {"p": 4000.0}) for t in np.arange(2.0, 3.001, 0.1)]
    trace = Trace.from_samples(samples, 10.0, gap_limit_s=0.25)
    pieces = covered_intervals(trace.times_s, 0.0, 3.0, 0.25)
    assert pieces == [(0.0, pytest.approx(1.1)), (pytest.approx(1.9), 3.0)]  # a value holds one interval
    result = window_energy(trace, 0.0, 3.0, stream(0.0, 3.0), power_key="p")
    assert result["coverage"] == pytest.approx(2.2 / 3) and result["max_gap_s"] == pytest.approx(1.0)
    # 4 W per 100 images/s = 40 mJ per image, not 4000·2.2/300 ≈ 29 (the old division by every image).
    assert result["energy_mj_per_image"] == pytest.approx(40.0)
    assert result["degraded"] and "low_coverage" in result["degraded_reasons"]


def test_too_little_coverage_publishes_no_energy():
    trace = Trace.from_samples([(0.0, {"p": 1000.0}), (0.1, {"p": 1000.0})], 10.0, gap_limit_s=0.25)
    result = window_energy(trace, 0.0, 1.0, stream(0.0, 1.0), power_key="p")
    assert result["coverage"] < 0.5 and result["energy_mj_per_image"] is None
    assert "too little to publish" in result["degraded_reasons"]["low_coverage"]


def test_a_step_between_sparse_samples_is_flagged_undersampled():
    trace = Trace.from_samples([(0.0, {"p": 5000.0}), (0.1, {"p": 5000.0}), (0.2, {"p": 10000.0}),
                                (0.3, {"p": 10000.0})], 10.0, gap_limit_s=0.25)
    result = window_energy(trace, 0.0, 0.3, stream(0.0, 0.3), power_key="p")
    assert result["degraded_reasons"].keys() == {"undersampled"} and result["energy_uncertainty_rel"] > 0.02


def test_trace_flags_reach_the_result():
    trace = Trace.from_samples([(t, {"p": 1000.0}) for t in np.arange(0, 1.01, 0.1)], 10.0, gap_limit_s=0.25,
                               flags={"jtop_not_ok": "ok() returned False"})
    result = window_energy(trace, 0.0, 1.0, stream(0.0, 1.0), power_key="p")
    assert result["degraded"] and result["degraded_reasons"] == {"jtop_not_ok": "ok() returned False"}


class RepeatingSource(Sampler):
    """A source that, like a stalled jtop service, keeps handing out one old measurement."""

    name = "repeating"

    def __init__(self):
        super().__init__(rate_hz=50)
        self.measured_at = time.monotonic()

    def read(self):
        return {"p": 1000.0}

    def sample_now(self):
        return [(self.measured_at, self.read())]


def test_repeated_measurements_are_kept_once_and_flagged_stale():
    sampler = RepeatingSource()
    sampler.start()
    time.sleep(0.2)
    trace = sampler.stop()
    assert len(trace.times_s) == 1, "the old sampler recorded the frozen value at full rate"
    assert "stale" in trace.flags and trace.staleness_max_s > sampler.stale_limit_s


def test_samples_are_stamped_when_measured_not_before_the_read():
    """A read that takes 40 ms measures at its end: the stamp is the read's middle, not its start."""

    class SlowSource(Sampler):
        name = "slow"

        def read(self):
            time.sleep(0.04)
            return {"measured_at": time.monotonic()}

    sampler = SlowSource(rate_hz=10)
    stamp, values = sampler.sample_now()[0]
    assert values["measured_at"] - stamp < 0.03

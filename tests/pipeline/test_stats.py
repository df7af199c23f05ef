"""Intervals over windows, paired ratios, interleaved rounds and the noisy-window flag."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from device.telemetry import contention
from device.jobs.window import Contention, SeriesStats, TelemetrySummary
from device.jobs.measure import MeasureSpec, measure
from pipeline import stats


@pytest.mark.slow  # 300 simulated experiments
def test_median_interval_has_its_width_and_coverage_on_synthetic_windows():
    """Windows drawn from N(10, 1): the median's standard error is σ·sqrt(π/2)/sqrt(n), and about 95% of
    intervals over repeated experiments hold the true 10."""
    rng = np.random.default_rng(7)
    n, experiments = 60, 300
    half_width = 1.96 * np.sqrt(np.pi / 2) / np.sqrt(n)
    covered, widths = 0, []
    for _ in range(experiments):
        _, low, high = stats.median_interval(rng.normal(10.0, 1.0, size=n))
        covered += low <= 10.0 <= high
        widths.append((high - low) / 2)
    assert 0.88 <= covered / experiments <= 0.99
    assert np.mean(widths) == pytest.approx(half_width, rel=0.25)


def test_median_interval_of_identical_windows_is_a_point_and_of_one_window_has_no_width():
    assert stats.median_interval([4.0] * 5) == (4.0, 4.0, 4.0)
    assert stats.median_interval([3.0]) == (3.0, 3.0, 3.0)
    assert np.isnan(stats.median_interval([])[0])


def test_paired_ratio_cancels_a_busy_round():
    """Round 3 is busy: both rungs run 3× slower. The student is exactly half the teacher in every round."""
    teacher = [4.0, 4.0, 12.0, 4.0, 4.0]
    student = [2.0, 2.0, 6.0, 2.0, 2.0]
    estimate, low, high = stats.ratio_interval(student, teacher)
    assert (estimate, low, high) == pytest.approx((0.5, 0.5, 0.5))
    assert stats.significant(low, high)


def test_a_ratio_whose_interval_holds_one_is_no_measurable_difference():
    rng = np.random.default_rng(3)
    teacher = rng.normal(5.0, 0.5, 8)
    student = rng.normal(5.0, 0.5, 8)
    estimate, low, high = stats.ratio_interval(student, teacher)
    assert low < 1 < high and not stats.significant(low, high)
    assert stats.cv([1.0, 1.0, 1.0]) == 0.0 and stats.cv([1.0]) is None


def test_noise_flags_name_the_cause_and_the_fix():
    flags = contention.noise_flags(Contention(other_cpu_cores=0.9, governor="powersave"), latency_cv=0.3,
                                   clocks_dropped=True)
    assert set(flags) == {"busy_device", "high_variance", "clocks_dropped", "governor"}
    assert "stop other work" in flags["busy_device"] and "jetson_clocks" in flags["clocks_dropped"]
    assert contention.noise_flags(Contention(other_cpu_cores=0.01, governor="performance"), latency_cv=0.02) == {}
    # NVML: SwThermalSlowdown (0x20) is throttling; GpuIdle (0x1) is not.
    def nvml(peak):
        return TelemetrySummary(source="nvml", samples=2, samples_in_window=2,
                                series={"throttle_reasons": SeriesStats(peak=peak)})

    assert contention.nvml_throttled(nvml(float(0x20 | 0x1)))  # SwThermalSlowdown
    assert not contention.nvml_throttled(nvml(1.0))  # GpuIdle only


class Sleeper:
    """A runner whose every call sleeps: its window uses no CPU, whatever runs beside it."""

    def infer(self, batch):
        time.sleep(0.01)


@pytest.mark.slow
def test_a_window_with_another_busy_process_is_flagged(tmp_path):
    """The hog's CPU time, read from the hog itself, is counted in the window's other-process cores and flagged.

    Compared with the hog's own rate, not with a "quiet" window: under pytest-xdist (or any busy host) no window
    is quiet, and the other processes' load changes from one window to the next.
    """
    import psutil

    hog = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.3)
        process = psutil.Process(hog.pid)
        cpu_before, started = sum(process.cpu_times()[:2]), time.perf_counter()
        busy_window = measure(Sleeper(), np.zeros((1, 1), np.float32), MeasureSpec(warmup_iterations=0, iterations=80,
                                                                                idle_s=0))
        hog_cores = (sum(process.cpu_times()[:2]) - cpu_before) / (time.perf_counter() - started)
    finally:
        hog.kill()
        hog.wait()
    assert hog_cores > contention.OTHER_CORES_LIMIT, f"the hog ran at {hog_cores:.2f} cores: the host is saturated"
    # The window is a little shorter than the measure() call around it; the hog's rate is steady.
    assert busy_window.contention.other_cpu_cores >= 0.8 * hog_cores, (busy_window.contention, hog_cores)
    assert "busy_device" in contention.noise_flags(busy_window.contention, busy_window.latency_cv)


@pytest.mark.slow
def test_rungs_are_interleaved_in_rounds_and_reported_with_intervals(tiny_run):
    results = json.loads((tiny_run.run_dir / "deploy" / "results.json").read_text())
    device = results["devices"][0]
    started = []
    for rung, entry in device["rungs"].items():
        assert len(entry["rounds"]) == 2, "tiny.yaml asks for two rounds"
        started += [(when, rung, result["spec"]["label"].rsplit("/", 1)[-1])
                    for when, result in zip(entry["round_started_at"], entry["rounds"])]
    # When the agent started each window's job: round by round, every rung once per round.
    order = [(rung, round_) for _, rung, round_ in sorted(started)]
    assert order == [(rung, f"round{r}") for r in (1, 2)
                     for rung in ("teacher", "pruned", "student", "student_fp16", "student_int8")]
    report = json.loads((tiny_run.run_dir / "report" / "results.json").read_text())
    row = next(r for r in report["rows"] if r["rung"] == "student_int8")
    assert row["windows"] == 2 and row["latency_p50_low_ms"] <= row["latency_p50_ms"] <= row["latency_p50_high_ms"]
    assert row["latency_ratio_low"] <= row["latency_ratio_vs_dc_teacher"] <= row["latency_ratio_high"]
    markdown = (tiny_run.run_dir / "report" / "report.md").read_text()
    assert "p50 ms [95% CI]" in markdown and "paired windows" in markdown
